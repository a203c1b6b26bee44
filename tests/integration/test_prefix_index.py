"""The prefix index in a real redis-server and in process: the same answers for the same events."""

from __future__ import annotations

import uuid

import pytest

from kvferry.kvcache import BlockRemoved, BlockStored
from kvferry.kvcache.prefix_index import InMemoryPrefixIndex, RedisPrefixIndex, leading_runs


def test_leading_runs_count_only_unbroken_runs_from_the_first_block():
    holders = [{"a", "b"}, {"a", "b"}, {"b"}, {"a", "b"}]
    assert leading_runs(holders) == {"a": 2, "b": 4}
    assert leading_runs([{"a"}, set(), {"a"}]) == {"a": 1}
    assert leading_runs([set(), {"a"}]) == {}
    assert leading_runs([]) == {}


@pytest.fixture(params=["memory", "redis"])
def index(request):
    if request.param == "memory":
        return InMemoryPrefixIndex()
    # A fresh model name per test keeps tests sharing one redis-server apart.
    return RedisPrefixIndex(request.getfixturevalue("redis_url"), model=f"m-{uuid.uuid4().hex[:8]}")


def test_stored_and_removed_events_move_the_longest_prefix(index):
    chain = [11, 12, 13, 14]
    index.apply("p0", [BlockStored(11, 0), BlockStored(12, 11), BlockStored(13, 12)])
    index.apply("p1", [BlockStored(11, 0)])
    assert index.cached_prefix_blocks(chain) == {"p0": 3, "p1": 1}
    index.apply("p0", [BlockRemoved(12)])  # a hole ends the run even though 13 is still there
    assert index.cached_prefix_blocks(chain) == {"p0": 1, "p1": 1}
    assert index.cached_prefix_blocks([99, 11]) == {}
    assert index.cached_prefix_blocks([]) == {}


def test_replace_node_drops_what_the_node_no_longer_holds(index):
    index.apply("p0", [BlockStored(1, 0), BlockStored(2, 1), BlockStored(3, 2)])
    index.apply("p1", [BlockStored(1, 0)])
    index.replace_node("p0", [1, 5])
    assert index.cached_prefix_blocks([1, 2, 3]) == {"p0": 1, "p1": 1}
    assert index.cached_prefix_blocks([1, 5]) == {"p0": 2, "p1": 1}
    index.replace_node("p0", [])
    assert index.cached_prefix_blocks([1, 5]) == {"p1": 1}


def test_lookup_against_a_dead_redis_answers_nothing_quickly():
    import time

    from kvferry.cli.ports import free_port

    dead = RedisPrefixIndex(f"redis://127.0.0.1:{free_port()}/0", model="m")
    started = time.monotonic()
    assert dead.cached_prefix_blocks([1, 2, 3]) == {}
    assert time.monotonic() - started < 2.0
    with pytest.raises(Exception):  # noqa: B017 - writers see the failure and resync later
        dead.apply("p0", [BlockStored(1, 0)])
