"""The serving-path fixture most fault tests share: one prefill and one decode node over UCX, a real
redis-server and the router, with the test defaults of tests/support/disaggregated_cluster.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.disaggregated_cluster import DisaggregatedCluster


@pytest.fixture
def pd_cluster(tiny_models: dict[str, Path]) -> Iterator[DisaggregatedCluster]:
    cluster = DisaggregatedCluster(tiny_models["llama"])
    yield cluster
    cluster.stop()
