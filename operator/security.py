"""The security settings every pod the operator creates runs with (the chart's operator pod uses the same).

Non-root, read-only root filesystem, no privilege escalation, no capabilities: the processes need none of
them, and writable paths are explicit emptyDir volumes.
"""

from __future__ import annotations

from typing import Any

KVFERRY_UID = 10001


def pod_security_context(uid: int = KVFERRY_UID) -> dict[str, Any]:
    # fsGroup makes PVC-mounted model folders readable by the non-root user.
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
