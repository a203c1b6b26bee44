"""The pods tier's fixture: one single-node Kubernetes with real pods for the session (tests/pods/real_node.py).

Tests that use it are marked `pods`, so `pytest -m "not pods"` leaves them out. Without its prerequisites
(root, Debian's containerd and CNI plugins, the node binaries, the image) the tests skip with the `make`
target that provides each; when CI is set they fail instead: `make test` builds all of them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from cluster.fixtures import require_binaries
from pods.real_node import IMAGE_IMPORT_S, NODE_START_S, PodsNode, kvferry_image, missing_prerequisites
from pods.served_cluster import ServedCluster, install

DEFAULT_TEST_TIMEOUT_S = 600  # pyproject.toml's pytest timeout, which the first test's setup would exceed


@pytest.fixture(scope="session")
def pods_node() -> Iterator[PodsNode]:
    require_binaries()
    missing = missing_prerequisites()
    if missing:
        message = "the pods tier needs " + "; ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    node = PodsNode()
    try:
        node.up()
        node.import_image(kvferry_image())
        yield node
    finally:
        node.down()


@pytest.fixture(scope="session")
def served(pods_node: PodsNode) -> ServedCluster:
    """The example cluster, installed once for the tier; test_real_pods_teardown.py takes it down."""
    return install(pods_node)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = True
    for item in items:
        if "pods_node" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.pods)
            if first:  # its setup starts the node and imports the image: on a fresh machine, a 6 GB import
                item.add_marker(pytest.mark.timeout(NODE_START_S + IMAGE_IMPORT_S + DEFAULT_TEST_TIMEOUT_S))
                first = False
