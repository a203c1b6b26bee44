"""The planner benchmarks' simulated cluster (benchmarks/planner_cluster_sim.py) on cases small enough to
compute by hand: FIFO prefill, decode steps that slow down as the batch grows, a request waiting for KV,
start-up and drain in node-seconds; and the curves and the day's workload it is fed."""

from __future__ import annotations

import math

import pytest
from support.benchmarks_package import import_benchmark

from kvferry.operator.planner.readings import NodeGauges, PrefillPhases, RouterTotals

sim_module = import_benchmark("planner_cluster_sim")
service_times = import_benchmark("planner_service_times")
workload = import_benchmark("planner_workload")
kwok = import_benchmark("planner_kwok")
Request, ClusterSim, Histogram, Slo = sim_module.Request, sim_module.ClusterSim, sim_module.Histogram, sim_module.Slo

# prefill takes prompt tokens / 100 seconds; a decode step 0.1 s per stream in the batch
LINEAR = service_times.ServiceTimes(prefill_points=((100, 1.0), (200, 2.0)), decode_points=((1, 0.1), (2, 0.2)),
                                    kv_tokens=10_000, max_batch=64)
# A: prefilled 0-1 s, then 20 decode steps; B: arrives at 0.5 s, queues behind A, prefilled 1-2 s, 2 steps
TWO = [Request(0.0, 100, 21), Request(0.5, 100, 3)]


def one_of_each(times: service_times.ServiceTimes, requests: list) -> ClusterSim:
    sim = ClusterSim(requests, times, startup_s=5.0)
    sim.add_replica("prefill", "p0", ready_s=0.0)
    sim.add_replica("decode", "d0", ready_s=0.0)
    return sim


def test_the_fitted_curves_go_through_the_measured_points():
    assert LINEAR.prefill_s(150) == pytest.approx(1.5)
    assert LINEAR.step_s(8) == pytest.approx(0.8)
    curved = service_times.ServiceTimes(((100, 1.0), (200, 3.0), (300, 6.0)), ((1, 0.1), (2, 0.2)), 100, 8)
    assert curved.prefill_s(200) == pytest.approx(3.0)  # a parabola through three points meets each
    assert curved.prefill_s(400) == pytest.approx(10.0)
    assert service_times.ServiceTimes.from_json(curved.as_json()) == curved


def test_prefill_is_first_come_first_served_and_decode_steps_slow_as_the_batch_grows():
    sim = one_of_each(LINEAR, TWO)
    sim.run_until(math.inf)
    assert sim.ttft_s.tolist() == pytest.approx([1.0, 1.5])  # B waited for A's prefill
    # A decodes alone from 1 s to 2 s (10 steps of 0.1 s), beside B from 2 s to 2.4 s (2 steps of 0.2 s),
    # then alone again for its last 8 steps: its 20 gaps end at 3.2 s. B's 2 gaps end at 2.4 s.
    assert sim.mean_gap_s.tolist() == pytest.approx([(3.2 - 1.0) / 20, (2.4 - 2.0) / 2])
    assert Slo(ttft_s=1.2, mean_gap_s=0.15).attained(sim).tolist() == [True, False]


def test_a_request_waits_for_kv_and_its_wait_counts_in_its_gaps():
    small_pool = service_times.ServiceTimes(LINEAR.prefill_points, LINEAR.decode_points, kv_tokens=200,
                                            max_batch=64)
    sim = one_of_each(small_pool, TWO)  # A holds 121 tokens of 200, so B (103) waits until A ends at 3 s
    sim.run_until(2.5)
    gauges = sim.gauges("decode")
    assert (gauges.replicas, gauges.running, gauges.kv_usage) == (1, 1.0, pytest.approx(121 / 200))
    sim.run_until(math.inf)
    assert sim.mean_gap_s.tolist() == pytest.approx([2.0 / 20, (3.2 - 2.0) / 2])


def test_the_router_counts_prompt_tokens_at_arrival_and_ttft_at_the_first_token():
    sim = one_of_each(LINEAR, TWO)
    sim.run_until(1.2)
    totals = sim.router_totals()
    assert totals.prompt_tokens == 200
    assert totals.ttft[1.0] == 1 and totals.ttft[math.inf] == 1  # only A's first token so far, at 1.0 s


def test_a_replica_serves_after_its_start_up_and_counts_until_it_has_left():
    sim = one_of_each(LINEAR, [Request(30.0, 100, 2)])
    sim.run_until(10.0)
    sim.add_replica("prefill", "p1")  # serves at 15 s
    sim.add_replica("decode", "d1")
    sim.run_until(12.0)
    assert [r.name for r in sim.serving("prefill")] == ["p0"]
    sim.remove_replica("decode", "d1")  # still starting: gone at once
    sim.run_until(20.0)
    assert [r.name for r in sim.serving("prefill")] == ["p0", "p1"]
    sim.remove_replica("prefill", "p1")
    assert sim.live("prefill") == ["p0"]
    assert sim.node_seconds(40.0) == pytest.approx(40 + 40 + (20 - 10) + (12 - 10))


def test_a_value_on_a_bucket_bound_counts_in_that_bucket():
    histogram = Histogram((1.0, 2.0))
    histogram.observe(1.0)
    histogram.observe(1.5, count=2)
    assert histogram.cumulative() == {1.0: 1, 2.0: 3, math.inf: 3}


def test_the_day_follows_the_diurnal_rate_and_keeps_the_prompts_in_the_context():
    day_s = 24 * 600.0  # an hour of the day is 600 s
    requests = workload.diurnal_requests(peak_rps=5.0, day_s=day_s)
    per_hour = [0] * 24
    for request in requests:
        per_hour[int(request.arrival_s // 600)] += 1
    expected = [5.0 * 600 * (a + b) / 2 for a, b in zip(workload.DIURNAL, (*workload.DIURNAL[1:], workload.DIURNAL[0]),
                                                         strict=True)]
    for hour in (3, 12):  # the quietest and the busiest
        assert per_hour[hour] == pytest.approx(expected[hour], rel=0.1)
    assert max(request.prompt_tokens for request in requests) <= workload.MAX_PROMPT_TOKENS


def test_the_pods_texts_read_back_as_the_simulated_cluster():
    """planner_kwok's /metrics answers, parsed by the operator's readings: two routers' halves add up to the
    cluster's counters, and the node pods' gauges to its decode gauges."""
    sim = one_of_each(LINEAR, TWO)
    sim.run_until(2.5)
    totals = sim.router_totals()
    assert RouterTotals.of([kwok.router_text(totals, 0.5)] * 2) == totals
    gauges = NodeGauges.of([kwok.node_text("decode", "d0", 3, 0.25), kwok.node_text("decode", "d1", 1, 0.75)])
    assert (gauges.replicas, gauges.running, gauges.kv_usage) == (2, 4.0, 0.5)
    prefill = sim.replicas["prefill"]["p0"]
    text = kwok.node_text("prefill", "p0", 0.0, None, {"queue": prefill.queue.cumulative(),
                                                         "prefill": prefill.compute.cumulative()},
                          prefill.busy_s(sim.now_s))
    assert PrefillPhases.of([text]) == sim.prefill_phases()


def test_a_prefill_replica_observes_each_prompts_wait_and_compute_when_its_prefill_ends():
    """A waits for nothing and computes 1 s; B arrives at 0.5 s and waits behind A until 1 s: the node's
    queue phase holds 0 and 0.5 s, its prefill phase 1 s twice, as a prefill node observes them."""
    sim = one_of_each(LINEAR, TWO)
    sim.run_until(1.5)
    assert sim.prefill_phases().queue_p90_s(PrefillPhases()) < 0.001  # only A has ended: it did not wait
    sim.run_until(2.5)
    phases = sim.prefill_phases()
    queue = phases.queue["p0"]
    assert (queue[0.001], queue[0.5], queue[math.inf]) == (1.0, 2.0, 2.0)  # 0 s and 0.5 s (on its bound)
    assert phases.compute["p0"][1.0] == 2.0 and phases.compute["p0"][0.5] == 0.0


def test_a_prefill_replicas_busy_seconds_grow_with_the_compute_it_has_done():
    """As a node counts its steps' time: A's second at 0.5 s is half done; B, queued at 0.5 s, starts only
    when A ends, so at 1.5 s one and a half seconds are done; from 2 s on the queue is empty and both are."""
    sim = one_of_each(LINEAR, TWO)
    busy = []
    for until_s in (0.5, 1.5, 2.5):
        sim.run_until(until_s)
        busy.append(sim.prefill_phases().busy_s["p0"])
    assert busy == pytest.approx([0.5, 1.5, 2.0])
