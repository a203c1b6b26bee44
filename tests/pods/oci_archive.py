"""Writes to stdout an OCI archive of one image of an OCI layout, without the layers the importer has.

    python3 oci_archive.py LAYOUT REF_NAME IMAGE_NAME < digests the importer has, one per line

node.sh pipes it into `ctr images import`: containerd unpacks the image from the layers it holds and
the ones the archive brings, so a rebuilt image costs its changed layers instead of all 6 GB of it. The
archive names the image IMAGE_NAME (containerd's io.containerd.image.name annotation). The manifest and
the config always travel: they are small, and containerd keeps one copy of what it has already.
Standard library only: node.sh runs it with the system's python3.
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path
from typing import BinaryIO

REF_NAME = "org.opencontainers.image.ref.name"
IMAGE_NAME = "io.containerd.image.name"


def blob(layout: Path, digest: str) -> Path:
    algorithm, encoded = digest.split(":", 1)
    return layout / "blobs" / algorithm / encoded


def add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_archive(
    layout: Path, ref_name: str, image_name: str, present: set[str], out: BinaryIO
) -> tuple[int, int]:
    """Writes the archive to `out` (a stream: the tar is never seeked); returns (layers sent, layers in the image)."""
    index = json.loads((layout / "index.json").read_text())
    found = [entry for entry in index["manifests"] if entry.get("annotations", {}).get(REF_NAME) == ref_name]
    if len(found) != 1:
        raise SystemExit(f"oci_archive.py: {len(found)} manifests named {ref_name!r} in {layout}/index.json")
    manifest_entry = found[0]
    manifest = json.loads(blob(layout, manifest_entry["digest"]).read_bytes())
    layers = [layer["digest"] for layer in manifest["layers"]]
    missing = [digest for digest in layers if digest not in present]
    named = {**manifest_entry, "annotations": {IMAGE_NAME: image_name}}
    with tarfile.open(fileobj=out, mode="w|") as tar:
        add_bytes(tar, "oci-layout", (layout / "oci-layout").read_bytes())
        add_bytes(tar, "index.json", json.dumps({"schemaVersion": 2, "manifests": [named]}).encode())
        for digest in dict.fromkeys([manifest_entry["digest"], manifest["config"]["digest"], *missing]):
            tar.add(blob(layout, digest), arcname=str(blob(Path(), digest)))
    return len(missing), len(layers)


def main() -> None:
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    layout, ref_name, image_name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    sent, total = write_archive(
        layout, ref_name, image_name, set(sys.stdin.read().split()), sys.stdout.buffer
    )
    print(f"oci_archive.py: {sent} of {total} layers sent", file=sys.stderr)


if __name__ == "__main__":
    main()
