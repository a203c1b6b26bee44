"""One role's replica count, decided once an interval from what the last interval showed.

The replicas a role needs for the next interval are the forecast load over the load one replica may carry
at the target. That capacity is read from the interval itself when its latency says enough (a role well
below its floor says little: any count would look fine), or, for a prefill pool whose nodes count their
busy time, from the work it did (Erlang C, erlang.py); else the last capacity learnt stands; with none
learnt yet, the count stays. Anti-flapping, Kubernetes' HPA's way: a scale-up waits out a short cool-down
and at most doubles the role (or adds 4); a scale-down takes the highest recommendation of a whole window,
so it happens only after the load has stayed low that long, and removes at most half.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvferry.operator.planner.erlang import servers_for_wait
from kvferry.operator.planner.forecast import LoadForecast
from kvferry.operator.planner.pressure import LatencyShape, kv_pressure, latency_pressure, updated_floor

INFORMATIVE_PRESSURE = 0.5  # below it, latency is too close to its floor to say what a replica can carry
INFORMATIVE_WAIT_PRESSURE = 1.0  # the same for a pool's wait (_informative_from)
OVERLOAD_PRESSURE = 1.5  # above it, a queue is growing: the latency says the role is short, not by how much
QUANTILE = 0.9  # of the latency targets (a p90 each)
CAPACITY_WEIGHT = 0.5  # of a new capacity reading in the one remembered
SCALE_UP_STEP = 4  # a scale-up may add this many replicas, or double the role if that is more


@dataclass(frozen=True)
class ScalingPolicy:
    """A role's bounds and targets (from the InferenceCluster's spec)."""

    min_replicas: int
    max_replicas: int
    latency_target_s: float  # TTFT p90 for prefill, inter-token latency p90 for decode
    shape: LatencyShape  # prefill: queueing, decode: batching (pressure.py)
    kv_usage_target: float | None = None  # decode: the fraction of KV blocks in use to stay under
    scale_up_cooldown_s: float = 60.0
    scale_down_window_s: float = 300.0
    tolerance: float = 0.1  # a recommendation this close to the current count (relative) keeps it


@dataclass(frozen=True)
class Observation:
    """One role over the last interval."""

    at_s: float  # when the interval ended (any clock, as long as it only moves forward)
    replicas: int  # ready and serving
    load: float  # the role's work: prefill, prompt tokens (or requests) per second; decode, requests running
    latency_p90_s: float | None  # None: nothing measured in the interval
    kv_usage: float | None = None  # decode: fraction of KV blocks in use, mean over the replicas
    queue_p90_s: float | None = None  # prefill, where its nodes report it: the wait for a first step, p90
    compute_p90_s: float | None = None  # prefill: a prompt's compute alone, p90 over all the nodes have done
    busy_replicas: float | None = None  # prefill, where its nodes report it: their busy seconds per second
    compute_mean_s: float | None = None  # prefill: the node-seconds a prompt costs, mean over all they have done


@dataclass(frozen=True)
class PlannerState:
    """What one decision hands to the next. `fresh` starts it."""

    replicas: int  # the count decided last
    since_s: float  # the first observation's time
    changed_at_s: float | None = None
    forecast: LoadForecast | None = None
    capacity: float | None = None  # load one replica may carry at the target, learnt
    floor_s: float | None = None  # latency with no load in the way (pressure.py)
    recent: tuple[tuple[float, int], ...] = ()  # (time, recommended count) within the scale-down window
    missed: tuple[float, int] | None = None  # (load, ready replicas) of the last interval over the target
    # the ready count and the first observation that showed it (-inf: the count the planner started with)
    ready_since: tuple[int, float] = (0, -math.inf)
    seen_at_s: float | None = None  # the last observation's time

    @classmethod
    def fresh(cls, replicas: int, at_s: float) -> PlannerState:
        return cls(replicas=replicas, since_s=at_s, ready_since=(replicas, -math.inf))


@dataclass(frozen=True)
class Decision:
    replicas: int
    recommended: int  # what this interval alone asked for, before cool-downs and windows
    reason: str
    state: PlannerState


def plan(policy: ScalingPolicy, state: PlannerState, seen: Observation) -> Decision:
    forecast = state.forecast.updated(seen.load) if state.forecast else LoadForecast.first(seen.load)
    floor_s = updated_floor(state.floor_s, seen.latency_p90_s)
    ready_since = state.ready_since if state.ready_since[0] == seen.replicas else (seen.replicas, seen.at_s)
    interval_s = 0.0 if state.seen_at_s is None else seen.at_s - state.seen_at_s
    pressure = _pressure(policy, floor_s, seen, seen.at_s - ready_since[1] - interval_s)
    capacity = state.capacity
    informative = _informative_from(policy, seen)
    sized = _sized_by_work(policy, seen)
    reading = None
    if sized is not None:
        reading = seen.load / sized
    elif pressure is not None and informative <= pressure <= OVERLOAD_PRESSURE:
        reading = seen.load / seen.replicas / pressure
    if reading is not None:
        capacity = reading if capacity is None else CAPACITY_WEIGHT * reading + (1 - CAPACITY_WEIGHT) * capacity
    expected = forecast.next_interval()
    missed = None
    if seen.busy_replicas is None:
        # Only where the capacity is learnt from latency alone: the work sizes the pool every interval, and
        # a bursty interval's wait over the target at a count that suffices on average held that count + 1
        # through the whole peak in planner_trace (80 missed once at the ramp, 81 kept for two hours)
        missed = (seen.load, seen.replicas) if pressure is not None and pressure > 1 else state.missed
        if missed is not None and expected < missed[0] * (1 - policy.tolerance):
            missed = None  # the load has fallen below the one that count failed at
    # a capacity read from this interval's work argues for more replicas at any pressure (before a queue)
    recommended, why = _recommend(policy, state.replicas, seen, expected, pressure, capacity,
                                  informative if sized is None else 0.0)
    if missed is not None and recommended <= missed[1]:
        # a count that missed the target at this load is not tried again while the load stays: what keeps
        # an estimate's error from flapping the role around the count it needs
        recommended = min(policy.max_replicas, missed[1] + 1)
        why += f"; {missed[1]} missed the target at load {missed[0]:.3g}"
    recent = tuple(entry for entry in state.recent if entry[0] > seen.at_s - policy.scale_down_window_s)
    recent += ((seen.at_s, recommended),)
    state = replace(state, forecast=forecast, capacity=capacity, floor_s=floor_s, recent=recent, missed=missed,
                    ready_since=ready_since, seen_at_s=seen.at_s)
    replicas, action = _apply(policy, state, seen.at_s, recommended)
    if replicas != state.replicas:
        state = replace(state, replicas=replicas, changed_at_s=seen.at_s)
    return Decision(replicas, recommended, f"{action}: {why}", state)


def _pressure(policy: ScalingPolicy, floor_s: float | None, seen: Observation, served_before_s: float) -> float | None:
    """None when the interval says nothing about how full the role is.

    Latency is counted when a request ends, so the intervals just after new replicas start still show the
    queue the fewer replicas built: read as the new count's, that backlog doubled a count that already
    sufficed and then kept it (`missed`). A request that ended in the interval with latency L arrived at
    most L before the interval began; so the interval's p90 speaks for the ready count only when the count
    has served (from the observation that first showed it) at least that long before the interval began,
    `served_before_s`. A deep backlog is thus waited out as long as it is deep, as Kubernetes' HPA leaves
    new pods' metrics out for a while. KV usage is a level, not a sum over requests, and counts at once."""
    if seen.replicas == 0 or seen.load <= 0:
        return None
    readings = []
    if (latency := _latency(policy, floor_s, seen)) is not None:
        shape, floor, latency_s = latency
        if latency_s <= served_before_s:
            readings.append(latency_pressure(shape, floor, latency_s, policy.latency_target_s))
    if policy.kv_usage_target is not None and seen.kv_usage is not None:
        readings.append(kv_pressure(seen.kv_usage, policy.kv_usage_target))
    return max(readings, default=None)


def _latency(policy: ScalingPolicy, floor_s: float | None,
             seen: Observation) -> tuple[LatencyShape, float, float] | None:
    """(shape, floor, latency) of the part of the latency that replicas change, where the nodes tell it apart.

    A prompt's TTFT is its wait for a first step plus its own compute. Replicas shorten the wait only; the
    compute is the prompt mix's. Read from the TTFT p90, an interval with a few long prompts (a night's
    interval of 80 requests has its p90 set by its 8 longest) looks overloaded however many replicas idle,
    and the capacity learnt from it falls with every replica added. So where the nodes report both, the
    latency is the mix's usual compute p90 (over everything they have computed, steady where one interval's
    is not) plus this interval's wait p90: the TTFT p90 the usual mix would show behind this interval's
    queue, which only the load per replica moves. It stays the queueing shape's (M/M/1's response time is
    the compute plus the wait), with that compute as its floor."""
    if _reads_the_wait(policy, seen):
        if seen.queue_p90_s is None:
            return None  # no prompt finished its prefill in the interval
        return "queueing", seen.compute_p90_s, seen.compute_p90_s + seen.queue_p90_s
    if seen.latency_p90_s is None or floor_s is None:
        return None
    return policy.shape, floor_s, seen.latency_p90_s


def _reads_the_wait(policy: ScalingPolicy, seen: Observation) -> bool:
    return policy.shape == "queueing" and seen.compute_p90_s is not None


def _sized_by_work(policy: ScalingPolicy, seen: Observation) -> int | None:
    """The replicas the interval's work needed at the target, where the prefill nodes count their busy time.

    The pool did `busy_replicas` erlangs of work; Erlang C (erlang.py) says how many servers that work needs
    for the wait the target leaves the usual prompt (the target less the compute p90, as `_latency` reads
    the two), at the target's quantile. Unlike the wait, the work reads the load per replica at any load, so
    the capacity is learnt at night too and a rising load asks for replicas before a queue builds. Only
    while the wait is within that budget: a queue over it means the pool did less work than it was given
    (the busy time of a full pool is its replica count), and the wait says how short the pool is instead."""
    if (seen.busy_replicas is None or seen.compute_mean_s is None or seen.compute_mean_s <= 0 or seen.load <= 0
            or seen.busy_replicas <= 0 or (latency := _latency(policy, None, seen)) is None):
        return None
    _, compute_p90_s, latency_s = latency
    if latency_s > policy.latency_target_s:
        return None
    wait_s = max(0.0, policy.latency_target_s - compute_p90_s)
    return servers_for_wait(seen.busy_replicas, seen.compute_mean_s, wait_s, QUANTILE)


def _informative_from(policy: ScalingPolicy, seen: Observation) -> float:
    """The lowest pressure that says what a replica can carry. A pool's wait is read only from the target
    up: the prefill nodes are one queue before many servers (the router sends a prompt where the queue
    empties first), and such a queue's wait stays near zero until close to saturation (Erlang C: its p90 is
    0 while fewer than a tenth of the prompts wait), so below the target it bounds the load per replica
    without measuring it. Read through the M/M/1 shape, such a wait said less load than the pool carried,
    and the capacity learnt from it (150-230 prompt tokens/s per replica where a fixed pool carried about
    120, in planner_trace) took the count down until the queue came back."""
    return INFORMATIVE_WAIT_PRESSURE if _reads_the_wait(policy, seen) else INFORMATIVE_PRESSURE


def _recommend(policy: ScalingPolicy, current: int, seen: Observation, expected: float,
               pressure: float | None, capacity: float | None, informative: float) -> tuple[int, str]:
    if seen.load <= 0 and expected <= 0:
        return policy.min_replicas, "no load"
    said = f"load {seen.load:.3g} -> {expected:.3g} expected"
    if pressure is not None:
        said += f", pressure {pressure:.2f}"
    if pressure is not None and pressure > OVERLOAD_PRESSURE:
        needed = seen.replicas * pressure  # as hard as the latency says: the step cap below bounds it
    elif capacity is None or capacity <= 0:
        return current, f"{said}, no capacity learnt yet"
    else:
        needed = expected / capacity
        said += f", {capacity:.3g} per replica at the target"
    if current and abs(needed / current - 1) <= policy.tolerance:
        return current, said
    if needed < current:  # fewer replicas: with the tolerance as headroom, since the capacity is an estimate
        return max(policy.min_replicas, min(current, math.ceil(needed * (1 + policy.tolerance)))), said
    if pressure is not None and pressure < informative:
        # well under its targets now: a capacity learnt under other conditions does not argue for more
        return current, said
    cap = max(2 * current, current + SCALE_UP_STEP)
    return min(policy.max_replicas, cap, math.ceil(needed)), said


def _apply(policy: ScalingPolicy, state: PlannerState, now_s: float, recommended: int) -> tuple[int, str]:
    current = state.replicas
    since_change = math.inf if state.changed_at_s is None else now_s - state.changed_at_s
    if recommended > current:
        if since_change < policy.scale_up_cooldown_s:
            return current, f"hold at {current} (scale-up cool-down, {recommended} recommended)"
        return recommended, f"scale up {current} -> {recommended}"
    highest = max(count for _, count in state.recent)
    if highest >= current:
        return current, f"hold at {current}"
    settled = min(since_change, now_s - state.since_s) >= policy.scale_down_window_s
    if not settled:
        return current, f"hold at {current} (scale-down window, {highest} recommended)"
    target = max(highest, math.ceil(current / 2), policy.min_replicas)
    return target, f"scale down {current} -> {target}"
