"""The planner's readings from the text the routers' and nodes' own metric objects expose (RouterMetrics,
NodeMetrics): p90s as histogram_quantile gives them, over an interval, summed over router replicas."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from kvferry.node.metrics import NodeMetrics
from kvferry.operator.planner.readings import (
    NodeGauges,
    PrefillPhases,
    RouterTotals,
    decode_observation,
    prefill_observation,
    quantile,
)
from kvferry.router.metrics import RouterMetrics


def _text(metrics: RouterMetrics) -> str:
    return metrics.exposition().decode()


def test_quantile_is_linear_within_its_bucket():
    before = {0.5: 0.0, 1.0: 0.0, float("inf"): 0.0}
    after = {0.5: 50.0, 1.0: 100.0, float("inf"): 100.0}
    # 90 of 100: 40 into the 50 between 0.5 and 1.0
    assert quantile(before, after) == pytest.approx(0.5 + 0.5 * 40 / 50)


def test_quantile_counts_only_the_interval():
    before = {0.5: 1000.0, 1.0: 1000.0, float("inf"): 1000.0}  # a long, fast past
    after = {0.5: 1000.0, 1.0: 1010.0, float("inf"): 1010.0}  # this interval: 10 slow ones
    assert quantile(before, after) == pytest.approx(0.5 + 0.5 * 9 / 10)


def test_quantile_of_nothing_is_none_and_past_the_last_bound_is_that_bound():
    assert quantile({0.5: 3.0, float("inf"): 3.0}, {0.5: 3.0, float("inf"): 3.0}) is None
    assert quantile({}, {0.5: 0.0, 1.0: 0.0, float("inf"): 10.0}) == 1.0


def test_prefill_reading_sums_routers_and_takes_the_interval_difference():
    routers = [RouterMetrics(), RouterMetrics()]
    routers[0].prefix(1000, 200)  # before the interval
    before = RouterTotals.of(_text(r) for r in routers)
    for seconds in [0.3] * 5 + [0.9] * 5:
        routers[0].ttft.observe(seconds)
        routers[1].ttft.observe(seconds)
    routers[0].prefix(600, 100)
    routers[1].prefix(900, 400)
    after = RouterTotals.of(_text(r) for r in routers)
    seen = prefill_observation(60.0, 10.0, before, after, NodeGauges(2, 0.0, None))
    assert seen.load == pytest.approx((600 - 100 + 900 - 400) / 10.0)  # computed prompt tokens per second
    # 20 observations, 10 in (0.25, 0.5] and 10 in (0.75, 1.0]: rank 18 is 8 into the upper bucket
    assert seen.latency_p90_s == pytest.approx(0.75 + 0.25 * 8 / 10)
    assert (seen.replicas, seen.at_s) == (2, 60.0)


def test_decode_reading_takes_running_streams_and_mean_kv_usage_from_the_nodes():
    nodes = [NodeMetrics("decode", "decode-0"), NodeMetrics("decode", "decode-1")]
    nodes[0].running.set(12)
    nodes[0].kv_usage.set(0.5)
    nodes[1].running.set(8)
    nodes[1].kv_usage.set(0.3)
    gauges = NodeGauges.of([generate_latest(n.registry).decode() for n in nodes])
    router = RouterMetrics()
    before = RouterTotals.of([_text(router)])
    router.itl.observe_many([0.02] * 95 + [0.2] * 5)
    seen = decode_observation(30.0, before, RouterTotals.of([_text(router)]), gauges)
    assert (seen.replicas, seen.load) == (2, 20.0)
    assert seen.kv_usage == pytest.approx(0.4)
    assert 0.015 < seen.latency_p90_s <= 0.02  # the gaps' 90th is one of the 0.02 ones, in (0.015, 0.02]


def _phases(nodes: list[NodeMetrics]) -> PrefillPhases:
    return PrefillPhases.of(generate_latest(node.registry).decode() for node in nodes)


def test_prefill_waits_are_read_per_node_over_the_interval_and_compute_over_everything():
    """The queue phase is differenced node by node (a node new in the interval counts whole, one gone
    counts not at all: a sum over the nodes would go back when one leaves); the prefill phase is all of it."""
    old, staying, new = (NodeMetrics("prefill", name) for name in ("prefill-0", "prefill-1", "prefill-2"))
    for node in (old, staying):
        for _ in range(10):
            node.observe_ttft("queue", 30.0)  # a long backlog, before the interval
            node.observe_ttft("prefill", 0.3)
    before = _phases([old, staying])
    for _ in range(9):
        staying.observe_ttft("queue", 0.0)
        new.observe_ttft("queue", 0.0)
    staying.observe_ttft("queue", 3.0)
    new.observe_ttft("queue", 3.0)
    new.observe_ttft("prefill", 8.0)
    after = _phases([staying, new])  # prefill-0 was removed
    # 20 waits in the interval, 18 of them none: the 18th is the last in (0, 0.001]
    assert after.queue_p90_s(before) == pytest.approx(0.001)
    # 11 prompts computed by the nodes there now: 10 at 0.3 s (in (0.25, 0.5]), one at 8 s
    assert after.compute_p90_s() == pytest.approx(0.25 + 0.25 * 9.9 / 10)
    seen = prefill_observation(60.0, 30.0, RouterTotals(), RouterTotals(), NodeGauges(2, 0.0, None), before, after)
    assert (seen.queue_p90_s, seen.compute_p90_s) == (after.queue_p90_s(before), after.compute_p90_s())


def test_a_node_restarted_under_its_name_counts_from_its_restart():
    node = NodeMetrics("prefill", "prefill-0")
    for _ in range(10):
        node.observe_ttft("queue", 30.0)
    before = _phases([node])
    # the node's buckets reach past 30 s (a CPU prompt's wait runs tens of seconds): 30 s lies in (20, 40]
    assert before.queue_p90_s(PrefillPhases()) == pytest.approx(20.0 + 20.0 * 9 / 10)
    restarted = NodeMetrics("prefill", "prefill-0")
    restarted.observe_ttft("queue", 3.0)
    assert 2.5 < _phases([restarted]).queue_p90_s(before) <= 5.0


def test_busy_seconds_are_read_per_node_over_the_interval_and_a_prompts_mean_over_everything():
    """Busy replicas: each node's `kvferry:busy_seconds_total` since the interval began (a node new in it
    counts whole, one restarted counts from its restart) over the interval's seconds. A prompt's mean: the
    nodes' busy seconds over the prompts they have computed."""
    staying, restarted, new = (NodeMetrics("prefill", name) for name in ("prefill-0", "prefill-1", "prefill-2"))
    staying.busy_seconds.inc(100.0)
    restarted.busy_seconds.inc(50.0)
    before = _phases([staying, restarted])
    restarted = NodeMetrics("prefill", "prefill-1")
    staying.busy_seconds.inc(20.0)  # its step time in the interval, as the engine's on_step adds it
    restarted.busy_seconds.inc(5.0)
    new.busy_seconds.inc(5.0)
    for node, prompts in ((staying, 10), (restarted, 2), (new, 3)):
        for _ in range(prompts):
            node.observe_ttft("prefill", 1.0)
    after = _phases([staying, restarted, new])
    assert after.busy_replicas(before, 30.0) == pytest.approx((20.0 + 5.0 + 5.0) / 30.0)
    assert after.compute_mean_s() == pytest.approx((120.0 + 5.0 + 5.0) / 15)
    seen = prefill_observation(60.0, 30.0, RouterTotals(), RouterTotals(), NodeGauges(3, 0.0, None), before, after)
    assert (seen.busy_replicas, seen.compute_mean_s) == (after.busy_replicas(before, 30.0), after.compute_mean_s())


def test_without_the_nodes_phases_prefill_reads_the_ttft_alone():
    seen = prefill_observation(60.0, 30.0, RouterTotals(), RouterTotals(), NodeGauges(1, 0.0, None))
    assert (seen.queue_p90_s, seen.compute_p90_s, seen.busy_replicas, seen.compute_mean_s) == (None, None, None, None)
