"""tests/pods/oci_archive.py: the OCI archive node.sh imports holds the layers containerd lacks and names the image."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from pods.oci_archive import write_archive


def add_blob(layout: Path, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest.split(":")[1]).write_bytes(data)
    return digest


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, list[str]]:
    """A layout as skopeo writes it: two layers, a config, a manifest, index.json naming it `image`."""
    (tmp_path / "blobs" / "sha256").mkdir(parents=True)
    (tmp_path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    layers = [add_blob(tmp_path, b"base layer" * 1000), add_blob(tmp_path, b"the wheel's layer")]
    config = add_blob(tmp_path, b'{"architecture": "amd64"}')
    manifest = json.dumps(
        {"schemaVersion": 2, "config": {"digest": config}, "layers": [{"digest": d} for d in layers]}
    )
    manifest_digest = add_blob(tmp_path, manifest.encode())
    entry = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
             "annotations": {"org.opencontainers.image.ref.name": "image"}}  # fmt: skip
    (tmp_path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    return tmp_path, [manifest_digest, config, *layers]


def archive_members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {member.name: tar.extractfile(member).read() for member in tar.getmembers()}  # type: ignore[union-attr]


def test_only_the_layers_the_importer_lacks_travel_with_the_manifest_and_config(
    layout: tuple[Path, list[str]],
) -> None:
    folder, (manifest, config, base, wheel) = layout
    out = io.BytesIO()
    assert write_archive(folder, "image", "localhost/kvferry:0.1.0", {base}, out) == (1, 2)
    members = archive_members(out.getvalue())
    blob_names = {name for name in members if name.startswith("blobs/")}
    assert blob_names == {f"blobs/sha256/{digest.split(':')[1]}" for digest in (manifest, config, wheel)}
    index = json.loads(members["index.json"])
    assert [entry["digest"] for entry in index["manifests"]] == [manifest]
    assert index["manifests"][0]["annotations"] == {"io.containerd.image.name": "localhost/kvferry:0.1.0"}
    assert members[f"blobs/sha256/{wheel.split(':')[1]}"] == b"the wheel's layer"


def test_an_empty_store_gets_every_layer(layout: tuple[Path, list[str]]) -> None:
    folder, digests = layout
    out = io.BytesIO()
    assert write_archive(folder, "image", "localhost/kvferry:0.1.0", set(), out) == (2, 2)
    assert len([name for name in archive_members(out.getvalue()) if name.startswith("blobs/")]) == len(
        digests
    )


def test_a_reference_the_layout_lacks_is_refused(layout: tuple[Path, list[str]]) -> None:
    with pytest.raises(SystemExit, match="0 manifests named 'other'"):
        write_archive(layout[0], "other", "localhost/kvferry:0.1.0", set(), io.BytesIO())
