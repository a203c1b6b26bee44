"""The prefill pool sized from its nodes' busy time: Erlang C (operator/planner/erlang.py) and the planner's
rules when the nodes report it (plan.py, `_sized_by_work`)."""

from __future__ import annotations

import pytest

from kvferry.operator.planner.erlang import servers_for_wait, waiting_probability
from kvferry.operator.planner.plan import Observation, PlannerState, ScalingPolicy, plan

PREFILL = ScalingPolicy(min_replicas=1, max_replicas=20, latency_target_s=1.0, shape="queueing")
COMPUTE_P90_S, COMPUTE_MEAN_S = 0.25, 0.2  # the target leaves 0.75 s of wait to the usual prompt


def test_erlang_c_gives_the_textbook_waiting_probabilities():
    assert waiting_probability(1, 0.5) == pytest.approx(0.5)  # M/M/1: the utilization
    assert waiting_probability(2, 1.0) == pytest.approx(1 / 3)
    assert waiting_probability(4, 4.0) == 1.0  # a pool that cannot keep up
    assert waiting_probability(4, 0.0) == 0.0


def test_a_larger_pool_needs_fewer_servers_to_spare_for_the_same_wait():
    small, large = servers_for_wait(10.0, 1.0, 0.5, 0.9), servers_for_wait(100.0, 1.0, 0.5, 0.9)
    assert small > 10 and large > 100
    assert (large - 100) / 100 < (small - 10) / 10
    assert servers_for_wait(10.0, 1.0, 5.0, 0.9) <= small  # a longer wait allowed needs no more


def _busy(at: float, replicas: int, busy: float, queue: float = 0.0, load: float = 100.0) -> Observation:
    return Observation(at_s=at, replicas=replicas, load=load, latency_p90_s=COMPUTE_P90_S + queue,
                       queue_p90_s=queue, compute_p90_s=COMPUTE_P90_S, busy_replicas=busy,
                       compute_mean_s=COMPUTE_MEAN_S)


def test_a_pool_nearly_always_busy_is_scaled_up_before_anything_waits():
    """3.9 of 4 replicas busy and no wait yet: the wait alone reads nothing below the target (and held the
    count); the work says how many replicas it needs for the wait the target leaves."""
    needed = servers_for_wait(3.9, COMPUTE_MEAN_S, 1.0 - COMPUTE_P90_S, 0.9)
    decision = plan(PREFILL, PlannerState.fresh(4, 0.0), _busy(30, 4, 3.9))
    assert needed > 4 and decision.replicas == needed
    assert decision.state.capacity == pytest.approx(100.0 / needed)


def test_a_mostly_idle_pool_is_sized_down_from_its_work_after_the_window():
    """1 of 10 replicas busy, no wait: with the tolerance as headroom, about what Erlang C says, after the
    scale-down window (the wait below the target taught nothing before: the count stayed)."""
    needed = servers_for_wait(1.0, COMPUTE_MEAN_S, 1.0 - COMPUTE_P90_S, 0.9)
    state, counts = PlannerState.fresh(10, 0.0), []
    for at in range(30, 630, 30):
        decision = plan(PREFILL, state, _busy(at, 10, 1.0))
        state = decision.state
        counts.append(decision.replicas)
    assert counts[0] == 10 and counts[-1] < 10
    assert needed <= counts[-1] <= round(needed * (1 + PREFILL.tolerance)) + 1


def test_a_wait_over_the_target_is_read_from_the_wait_not_the_work():
    """A full pool's busy time is its replica count, whatever it was given: over the target, the wait says
    how short it is (2 s of wait, 2.25x the target: doubled). With the work sizing the pool every interval,
    one interval over the target does not hold its count + 1 while the load stays (`missed`)."""
    decision = plan(PREFILL, PlannerState.fresh(4, 0.0), _busy(30, 4, 4.0, queue=2.0))
    assert decision.replicas == 8 and decision.state.missed is None
