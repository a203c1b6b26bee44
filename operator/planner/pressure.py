"""How far a role is from its targets: the load one replica carries now over the load it may carry at the
target, read from the latency it shows (and, for decode, the KV it holds).

Latency has a floor, what a request costs with nothing else in the way (the lowest p90 seen); the
load adds to it in one of two shapes:
- `queueing` (prefill: prompts wait for the one running before them): M/M/1's response time,
  latency = floor / (1 - utilization), so utilization = 1 - floor / latency;
- `batching` (decode: every running stream shares each step): the step grows with the batch, latency =
  floor + slope x load, so the load is proportional to latency - floor.
Pressure 1 means the role is exactly at its target; 2, that each replica carries twice what it should.
A queue that has stopped draining breaks M/M/1 (it has no steady state past utilization 1), so above
the target the plain ratio latency / target is taken where it is larger: it scales up harder, never
softer, than the model.
"""

from __future__ import annotations

from typing import Literal

LatencyShape = Literal["queueing", "batching"]
MAX_UTILIZATION = 0.95  # of an M/M/1 estimate: beyond it the estimate says nothing more


def updated_floor(floor_s: float | None, latency_s: float | None) -> float | None:
    """The lowest latency seen: latency never goes below what a request costs alone, so the lowest one seen
    is the best bound there is. It only falls; a role that has only ever run loaded overestimates it and
    so underestimates its pressure, which a scale-down that misses corrects (plan.py: `missed`)."""
    if latency_s is None:
        return floor_s
    return latency_s if floor_s is None else min(floor_s, latency_s)


def latency_pressure(shape: LatencyShape, floor_s: float, latency_s: float, target_s: float) -> float:
    """The load per replica now over the load per replica at the target."""
    if target_s <= floor_s:  # the target is below what one request costs alone: as full as it can be
        return max(1.0, latency_s / target_s)
    if shape == "queueing":
        now = min(MAX_UTILIZATION, 1 - floor_s / latency_s)
        modelled = now / (1 - floor_s / target_s)
    else:
        modelled = (latency_s - floor_s) / (target_s - floor_s)
    if latency_s > target_s:
        return max(modelled, latency_s / target_s)
    return modelled


def kv_pressure(kv_usage: float, target: float) -> float:
    """KV blocks in use grow with the streams a decode node holds: linear."""
    return kv_usage / target

