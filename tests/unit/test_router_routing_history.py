"""The router's memory of where it sent each prompt's blocks: leading runs per node, TTL, size bound."""

from kvferry.router.scheduling.routing_history import RoutingHistory, combined


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_node_counts_the_leading_blocks_it_was_sent():
    history = RoutingHistory(ttl_seconds=30, clock=Clock())
    history.record([1, 2, 3], "p0")
    history.record([1, 2, 9, 10], "p1")
    assert history.cached_prefix_blocks([1, 2, 3, 4]) == {"p0": 3, "p1": 2}
    assert history.cached_prefix_blocks([1, 2, 9]) == {"p0": 2, "p1": 3}
    # A run ends at the first block the node was not sent, even when later blocks match.
    assert history.cached_prefix_blocks([7, 2, 3]) == {}


def test_entries_expire_after_the_ttl_and_are_refreshed_by_a_new_send():
    clock = Clock()
    history = RoutingHistory(ttl_seconds=10, clock=clock)
    history.record([1, 2], "p0")
    clock.now = 8
    history.record([1], "p0")
    clock.now = 11
    assert history.cached_prefix_blocks([1, 2]) == {"p0": 1}
    clock.now = 19
    assert history.cached_prefix_blocks([1, 2]) == {}


def test_the_oldest_blocks_are_forgotten_beyond_the_bound_and_a_zero_ttl_records_nothing():
    history = RoutingHistory(ttl_seconds=30, max_blocks=3, clock=Clock())
    history.record([1, 2, 3], "p0")
    history.record([4], "p0")
    assert history.cached_prefix_blocks([1]) == {}
    assert history.cached_prefix_blocks([2, 3, 4]) == {"p0": 3}
    off = RoutingHistory(ttl_seconds=0, clock=Clock())
    off.record([1], "p0")
    assert off.cached_prefix_blocks([1]) == {}


def test_combined_takes_the_longer_prefix_per_node():
    assert combined({"p0": 4, "p1": 1}, {"p1": 3, "p2": 2}) == {"p0": 4, "p1": 3, "p2": 2}
