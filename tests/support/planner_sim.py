"""A simulated role for the autoscaling planner: load in, latency out, replicas that take time to start.

Not a model of kvferry's nodes (a fake, named so): a role whose replicas each carry `capacity` load at
utilization 1, whose latency follows the shape the planner assumes (queueing or batching) times a seeded
noise, and whose new replicas are ready `startup_s` after the planner asks for them (removed ones leave
at once). The planner runs once an interval on what the interval showed, exactly as the operator calls it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from kvferry.operator.planner.plan import Observation, PlannerState, ScalingPolicy, plan


@dataclass(frozen=True)
class SimulatedRole:
    capacity: float  # load one replica carries at utilization 1
    floor_s: float  # latency with no load
    startup_s: float = 60.0
    noise: float = 0.0  # latency times a factor drawn uniformly from [1 - noise, 1 + noise]
    kv_capacity: float | None = None  # batching: load (streams) that fills one replica's KV

    def latency(self, policy: ScalingPolicy, load: float, replicas: int) -> float:
        utilization = load / (replicas * self.capacity)
        if policy.shape == "queueing":
            # past saturation the queue grows without bound: latency climbs steeply, not to infinity
            steady = min(utilization, 0.95)
            return self.floor_s / (1 - steady) * max(1.0, utilization / 0.95) ** 4
        return self.floor_s * (1 + 2 * utilization)  # the step at full load is 3x the empty one


@dataclass(frozen=True)
class Interval:
    at_s: float
    load: float
    ready: int  # replicas serving this interval
    asked: int  # the planner's count after it
    latency_s: float
    met: bool  # latency within the target (and KV within its target)
    reason: str


def simulate(policy: ScalingPolicy, role: SimulatedRole, load_at: Callable[[float], float], seconds: float,
             interval_s: float = 30.0, start_replicas: int = 1, seed: int = 0) -> list[Interval]:
    rng = random.Random(seed)
    state = PlannerState.fresh(start_replicas, 0.0)
    ready_at: list[float] = [0.0] * start_replicas  # when each asked-for replica serves
    timeline = []
    for step in range(1, int(seconds / interval_s) + 1):
        now = step * interval_s
        load = load_at(now)
        ready = max(1, sum(1 for at in ready_at if at <= now))
        latency = role.latency(policy, load, ready) * rng.uniform(1 - role.noise, 1 + role.noise)
        kv_usage = None if role.kv_capacity is None else min(1.0, load / ready / role.kv_capacity)
        seen = Observation(now, ready, load, latency if load > 0 else None, kv_usage)
        decision = plan(policy, state, seen)
        state = decision.state
        if decision.replicas > len(ready_at):
            ready_at += [now + role.startup_s] * (decision.replicas - len(ready_at))
        del ready_at[decision.replicas:]
        kv_met = kv_usage is None or policy.kv_usage_target is None or kv_usage <= policy.kv_usage_target
        timeline.append(Interval(now, load, ready, decision.replicas, latency,
                                 latency <= policy.latency_target_s and kv_met, decision.reason))
    return timeline


def direction_changes(timeline: list[Interval]) -> int:
    """How often the asked count turned from growing to shrinking or back: flapping counts here."""
    moves = [b.asked - a.asked for a, b in zip(timeline, timeline[1:], strict=False) if b.asked != a.asked]
    return sum(1 for a, b in zip(moves, moves[1:], strict=False) if (a > 0) != (b > 0))
