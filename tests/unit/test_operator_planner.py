"""The autoscaling planner (operator/planner/): its pieces alone, then whole traces on a simulated role
(tests/support/planner_sim.py, a fake role named so) for the promises: a load step is met within a
bounded time, the count comes back after the load ends and only after the scale-down window, and it does
not flap on a noisy steady load."""

from __future__ import annotations

import pytest
from support.planner_sim import SimulatedRole, direction_changes, simulate

from kvferry.operator.planner.forecast import LoadForecast
from kvferry.operator.planner.plan import Observation, PlannerState, ScalingPolicy, plan
from kvferry.operator.planner.pressure import kv_pressure, latency_pressure, updated_floor

PREFILL = ScalingPolicy(min_replicas=1, max_replicas=10, latency_target_s=1.0, shape="queueing")
DECODE = ScalingPolicy(min_replicas=1, max_replicas=20, latency_target_s=0.05, shape="batching",
                       kv_usage_target=0.8)


def test_pressure_is_one_at_the_target_in_both_shapes():
    assert latency_pressure("queueing", 0.25, 1.0, 1.0) == pytest.approx(1.0)
    assert latency_pressure("batching", 0.02, 0.05, 0.05) == pytest.approx(1.0)


def test_queueing_pressure_follows_utilization():
    # floor 0.25 s, target 1 s: the target is utilization 0.75; 0.5 s is utilization 0.5
    assert latency_pressure("queueing", 0.25, 0.5, 1.0) == pytest.approx(0.5 / 0.75)


def test_batching_pressure_is_linear_above_the_floor():
    assert latency_pressure("batching", 0.02, 0.035, 0.05) == pytest.approx(0.5)


def test_over_the_target_the_plain_ratio_scales_up_at_least_as_hard():
    # a queue past saturation: the M/M/1 estimate caps near 1 / 0.75, the ratio says 8
    assert latency_pressure("queueing", 0.25, 8.0, 1.0) == pytest.approx(8.0)


def test_a_target_below_the_floor_reads_as_full():
    assert latency_pressure("queueing", 2.0, 2.0, 1.0) == pytest.approx(2.0)


def test_kv_pressure_is_usage_over_its_target():
    assert kv_pressure(0.4, 0.8) == pytest.approx(0.5)


def test_the_floor_is_the_lowest_latency_seen():
    assert updated_floor(None, 0.3) == 0.3
    assert updated_floor(0.3, 0.2) == 0.2
    assert updated_floor(0.2, 1.3) == 0.2
    assert updated_floor(0.3, None) == 0.3


def test_forecast_holds_a_steady_load_and_leads_a_ramp():
    steady = LoadForecast.first(100.0)
    for _ in range(10):
        steady = steady.updated(100.0)
    assert steady.next_interval() == pytest.approx(100.0)
    ramp = LoadForecast.first(100.0)
    for step in range(1, 11):
        ramp = ramp.updated(100.0 + 10 * step)
    assert ramp.next_interval() > 200.0  # the last sample was 200: the trend carries it on


def _seen(at: float, replicas: int, load: float, latency: float | None, kv: float | None = None) -> Observation:
    return Observation(at_s=at, replicas=replicas, load=load, latency_p90_s=latency, kv_usage=kv)


def test_nothing_learnt_keeps_the_count():
    decision = plan(PREFILL, PlannerState.fresh(3, 0.0), _seen(30, 3, 50.0, 0.3))
    assert (decision.replicas, decision.recommended) == (3, 3)
    assert "no capacity learnt yet" in decision.reason


def test_over_the_target_scales_up_at_once_and_then_waits_the_cool_down():
    state = PlannerState.fresh(2, 0.0)
    state = plan(PREFILL, state, _seen(30, 2, 100.0, 0.25)).state  # the floor
    decision = plan(PREFILL, state, _seen(60, 2, 200.0, 3.0))
    assert decision.replicas > 2 and decision.reason.startswith("scale up 2 -> ")
    held = plan(PREFILL, decision.state, _seen(90, 2, 400.0, 9.0))
    assert held.replicas == decision.replicas and "cool-down" in held.reason
    assert held.recommended > held.replicas


def test_a_scale_up_at_most_doubles_or_adds_four():
    state = plan(PREFILL, PlannerState.fresh(1, 0.0), _seen(30, 1, 10.0, 0.25)).state
    decision = plan(PREFILL, state, _seen(60, 1, 1000.0, 100.0))
    assert decision.replicas == 5


def test_a_scale_down_waits_for_the_whole_window_and_halves_at_most():
    policy = PREFILL
    state = plan(policy, PlannerState.fresh(8, 0.0), _seen(30, 8, 8.0, 0.25)).state  # nearly idle: the floor
    at = 30.0
    for _ in range(3):  # learn the capacity at a load that needs about 8
        at += 30
        state = plan(policy, state, _seen(at, 8, 400.0, 0.85)).state
    replicas = []
    while at < 1000:  # the load falls to a tenth: one replica would do
        at += 30
        decision = plan(policy, state, _seen(at, state.replicas, 40.0, 0.26))
        state = decision.state
        replicas.append((at, decision.replicas))
    first_drop = next(at for at, count in replicas if count < 8)
    assert first_drop >= policy.scale_down_window_s
    assert [count for _, count in replicas if count < 8][0] == 4  # half, not straight to what the load needs


def test_no_load_goes_to_the_minimum_after_the_window():
    state = PlannerState.fresh(4, 0.0)
    counts = []
    for step in range(1, 40):
        decision = plan(PREFILL, state, _seen(30 * step, state.replicas, 0.0, None))
        state = decision.state
        counts.append(decision.replicas)
    assert counts[0] == 4 and counts[-1] == PREFILL.min_replicas


def test_kv_usage_scales_decode_even_when_latency_is_fine():
    state = plan(DECODE, PlannerState.fresh(2, 0.0), _seen(30, 2, 100.0, 0.021, kv=0.5)).state
    decision = plan(DECODE, state, _seen(60, 2, 200.0, 0.022, kv=1.0))  # latency near its floor, KV full
    assert decision.replicas >= 3


def test_the_count_stays_within_the_bounds():
    bounded = ScalingPolicy(min_replicas=2, max_replicas=3, latency_target_s=1.0, shape="queueing")
    timeline = simulate(bounded, SimulatedRole(capacity=100, floor_s=0.3), lambda at: 1000.0, 1200,
                        start_replicas=2)
    assert {interval.asked for interval in timeline} <= {2, 3}
    assert timeline[-1].asked == 3


def _step_load(low: float, high: float, rise_s: float, fall_s: float):
    """A cluster that starts idle (a tenth of the low load for 10 minutes: the planner sees latency's
    floor), then the low load, a step to the high one, and back."""
    return lambda at: low / 10 if at < 600 else high if rise_s <= at < fall_s else low


@pytest.mark.parametrize(("policy", "role", "low", "high"), [
    (PREFILL, SimulatedRole(capacity=100, floor_s=0.3, noise=0.1), 120.0, 400.0),
    (DECODE, SimulatedRole(capacity=64, floor_s=0.02, noise=0.1, kv_capacity=100), 64.0, 300.0),
], ids=["prefill-queueing", "decode-batching"])
def test_a_load_step_is_met_then_given_back_without_flapping(policy, role, low, high):
    rise, fall, end = 1200.0, 2400.0, 4200.0
    timeline = simulate(policy, role, _step_load(low, high, rise, fall), end, start_replicas=2)
    before = [i for i in timeline if 900 <= i.at_s < rise]
    during = [i for i in timeline if rise <= i.at_s < fall]
    after = [i for i in timeline if i.at_s >= fall]
    settled_count = before[-1].asked
    # met within 3 minutes of the step (a replica starts in one), and from then on at least 90% of intervals
    recovered = next(i.at_s for i in during if i.met and i.ready > settled_count)
    assert recovered - rise <= 180, [(i.at_s, i.ready, round(i.latency_s, 3)) for i in during[:8]]
    late = [i for i in during if i.at_s >= recovered]
    assert sum(i.met for i in late) / len(late) >= 0.9
    # no flapping: at most one correction during the step, and the count only falls once the load has
    assert direction_changes(during) <= 1, [(i.at_s, i.asked) for i in during]
    counts_after = [i.asked for i in after]
    assert counts_after == sorted(counts_after, reverse=True)
    first_drop = next(i.at_s for i in after if i.asked < during[-1].asked)
    assert first_drop - fall >= policy.scale_down_window_s - 30
    assert counts_after[-1] <= settled_count + 1  # back to about what the low load had


def test_a_noisy_steady_load_does_not_move_the_count():
    timeline = simulate(PREFILL, SimulatedRole(capacity=100, floor_s=0.3, noise=0.15), lambda at: 250.0, 6000,
                        start_replicas=4)
    settled = [i.asked for i in timeline if i.at_s >= 1800]
    assert len(set(settled)) == 1, settled
    assert sum(i.met for i in timeline if i.at_s >= 1800) / len(settled) >= 0.95


def _waited(at: float, replicas: int, queue: float, ttft: float = 0.5, load: float = 100.0) -> Observation:
    """A prefill interval as its nodes report it: prompts that cost 0.25 s alone (p90), `queue` s of wait."""
    return Observation(at_s=at, replicas=replicas, load=load, latency_p90_s=ttft, queue_p90_s=queue,
                       compute_p90_s=0.25)


def test_prompts_slow_on_their_own_are_no_overload_when_nothing_waited():
    """An interval whose few prompts were long (TTFT p90 twice the target) while no prompt waited: no
    replica would have helped, so the count stays; read from the TTFT alone, it doubles."""
    state = plan(PREFILL, PlannerState.fresh(4, 0.0), _waited(30, 4, 0.0, ttft=0.3)).state
    decision = plan(PREFILL, state, _waited(60, 4, 0.0, ttft=2.0))
    assert decision.replicas == 4 and decision.state.missed is None
    from_ttft = plan(PREFILL, state, _seen(60, 4, 100.0, 2.0))
    assert from_ttft.replicas == 8


def test_a_wait_past_what_the_target_leaves_scales_prefill_up():
    # prompts cost 0.25 s alone, the target is 1 s: 0.75 s of wait is the target; 2 s is 2.25x it
    state = plan(PREFILL, PlannerState.fresh(4, 0.0), _waited(30, 4, 0.0)).state
    decision = plan(PREFILL, state, _waited(60, 4, 2.0))
    assert decision.replicas == 8 and decision.state.missed == (100.0, 4)


def test_the_capacity_is_learnt_from_a_wait_at_or_over_the_target_only():
    """A pool's wait below the target bounds the load without measuring it: 0.5 s (M/M/1 would read
    utilization 2/3 of the target's 3/4) teaches nothing; 1 s (1.25 s of TTFT p90, 1.25x the target) does."""
    below = plan(PREFILL, PlannerState.fresh(4, 0.0), _waited(30, 4, 0.5))
    assert below.state.capacity is None and below.replicas == 4
    over = plan(PREFILL, below.state, _waited(60, 4, 1.0))
    assert over.state.capacity == pytest.approx(100.0 / 4 / 1.25)


def test_the_backlog_new_replicas_inherit_is_not_read_as_theirs():
    """4 replicas fall behind and the planner asks for 8; in the first intervals the 8 serve, the prompts
    that queued behind the 4 still end with long waits. Read as the 8's, that doubled the role to 16; the
    8's own latency counts once they have served two intervals, and then a real shortfall scales up (to
maxReplicas, 10)."""
    state = plan(PREFILL, PlannerState.fresh(4, 0.0), _waited(30, 4, 0.0)).state
    decision = plan(PREFILL, state, _waited(60, 4, 2.0, load=200.0))
    assert decision.replicas == 8
    state = plan(PREFILL, decision.state, _waited(90, 4, 3.0, load=200.0)).state  # the 4 new ones are starting
    counts = []
    for at in (120, 150):  # the 8 serve; the waits that end are the backlog's
        decision = plan(PREFILL, state, _waited(at, 8, 3.0, load=200.0))
        state = decision.state
        counts.append(decision.replicas)
    assert counts == [8, 8] and state.missed[1] == 4
    decision = plan(PREFILL, state, _waited(180, 8, 3.0, load=200.0))  # the 8's own wait: short too
    assert decision.replicas == PREFILL.max_replicas


def test_a_backlog_deeper_than_an_interval_is_waited_out_as_long_as_it_is_deep():
    """Prompts that end after 45 s of wait arrived before the 8 served: their wait speaks for the 8 only
    once the 8 have served 45 s before the interval began (from 120 s, the first interval showing them)."""
    state = plan(PREFILL, PlannerState.fresh(4, 0.0), _waited(30, 4, 0.0)).state
    state = plan(PREFILL, state, _waited(60, 4, 2.0, load=200.0)).state  # asks for 8
    state = plan(PREFILL, state, _waited(90, 4, 45.0, load=200.0)).state
    counts = []
    for at in (120, 150, 180, 210):
        decision = plan(PREFILL, state, _waited(at, 8, 45.0, load=200.0))
        state = decision.state
        counts.append(decision.replicas)
    # 210 s: the interval began at 180, 60 s after the 8 were first seen, more than the 45.25 s its p90 took
    assert counts == [8, 8, 8, PREFILL.max_replicas]
