"""Where a cluster's model weights come from, and how the pods get to see them.

The CRD schema can only say "a non-empty string"; this module decides whether the string can work.
A source that cannot work is a spec error the operator reports as a Degraded condition.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

MODEL_MOUNT_PATH = "/models"
MODEL_VOLUME = "model"
SUPPORTED_FORMS = "an absolute path inside the image, pvc://<claim>/<path> or hostpath:///<path>"

# A PersistentVolumeClaim name is a DNS-1123 subdomain.
_CLAIM_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclass(frozen=True)
class ModelMount:
    """The model folder as the containers see it, and the volume that puts it there (if any)."""

    path: str
    volume: dict[str, Any] | None = None

    def volume_mount(self) -> dict[str, Any] | None:
        if self.volume is None:
            return None
        return {"name": MODEL_VOLUME, "mountPath": MODEL_MOUNT_PATH, "readOnly": True}


def _clean_absolute(path: str, source: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"{source!r} is a relative path; use {SUPPORTED_FORMS}")
    if ".." in path.split("/"):
        raise ValueError(f"{source!r} escapes its root with '..'")
    return posixpath.normpath(path)


def parse_model_source(source: str) -> ModelMount:
    """Turn `spec.model.source` into a mount; ValueError says why a source cannot work."""
    if "://" not in source:
        return ModelMount(path=_clean_absolute(source, source))
    parts = urlsplit(source)
    if parts.scheme == "pvc":
        claim = parts.netloc
        if not _CLAIM_NAME.match(claim):
            raise ValueError(f"{source!r}: {claim!r} is not a PersistentVolumeClaim name")
        sub_path = _clean_absolute(parts.path or "/", source).lstrip("/")
        return ModelMount(
            path=posixpath.join(MODEL_MOUNT_PATH, sub_path) if sub_path else MODEL_MOUNT_PATH,
            volume={"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}},
        )
    if parts.scheme == "hostpath":
        if parts.netloc:
            raise ValueError(f"{source!r}: write hostpath:///<absolute path> (three slashes)")
        host_path = _clean_absolute(parts.path, source)
        if host_path == "/":
            raise ValueError(f"{source!r}: mounting the node's root folder is refused")
        return ModelMount(
            path=MODEL_MOUNT_PATH,
            volume={"name": MODEL_VOLUME, "hostPath": {"path": host_path, "type": "Directory"}},
        )
    raise ValueError(f"{source!r}: unsupported scheme {parts.scheme!r}; use {SUPPORTED_FORMS}")
