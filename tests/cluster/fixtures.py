"""pytest plugin with the Kubernetes test control plane's fixtures (tests/conftest.py loads it).

`kube` is one started ControlPlane for the whole session; `kube_namespace` gives a test its own namespace
in it. Tests that use either are marked `cluster`, so `-m "not cluster"` leaves them out.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster.control_plane import ControlPlane, default_bin_dir, missing_binaries


def require_binaries() -> Path:
    """The folder with the control plane's binaries; skips the test when they are not built, fails on CI."""
    bin_dir = default_bin_dir()
    missing = missing_binaries(bin_dir)
    if missing:
        message = f"missing in {bin_dir}: {', '.join(missing)}; run `make cluster-binaries`"
        # CI runs `make test`, which builds them: missing binaries there are a broken setup, not a skip.
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return bin_dir


@pytest.fixture(scope="session")
def kube() -> Iterator[ControlPlane]:
    """A started control plane, shared by the session: starting one takes seconds, a namespace does not."""
    with ControlPlane(require_binaries()) as plane:
        yield plane


@pytest.fixture
def kube_namespace(kube: ControlPlane) -> Iterator[str]:
    """A new namespace whose default ServiceAccount exists (pods are refused before it does)."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    kube.kubectl("create", "namespace", name)
    kube.kubectl("wait", "--for=create", "serviceaccount/default", f"--namespace={name}", "--timeout=60s")
    yield name
    # The namespace controller empties it in the background; the next test does not wait for that.
    kube.kubectl("delete", "namespace", name, "--wait=false")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if {"kube", "kube_namespace"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)
