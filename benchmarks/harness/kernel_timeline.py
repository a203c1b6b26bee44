"""Where a GPU timeline is idle: the kernels' busy time (the union of their intervals, since kernels launched
with programmatic dependent launch overlap) and the gaps between them, each put on the transition it sits
in (the kind of the kernel that ended last before it -> the kind of the one that starts after it)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Kernel:
    name: str
    start_us: float
    end_us: float


def idle_gaps(kernels: Sequence[Kernel], kind_of: Callable[[str], str], most: int = 8) -> dict[str, object]:
    """The timeline's span, busy and idle milliseconds, and its `most` largest idle totals by transition."""
    if not kernels:
        return {"kernels": 0}
    ordered = sorted(kernels, key=lambda kernel: kernel.start_us)
    busy_us, idle_us = 0.0, 0.0
    by_transition: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    segment_start, last = ordered[0].start_us, ordered[0]  # `last`: the kernel that ends the busy segment
    for kernel in ordered[1:]:
        if kernel.start_us > last.end_us:
            gap = kernel.start_us - last.end_us
            transition = f"{kind_of(last.name)} -> {kind_of(kernel.name)}"
            idle_us += gap
            by_transition[transition] += gap
            counts[transition] += 1
            busy_us += last.end_us - segment_start
            segment_start, last = kernel.start_us, kernel
        elif kernel.end_us > last.end_us:
            last = kernel
    busy_us += last.end_us - segment_start
    largest = sorted(by_transition, key=by_transition.__getitem__, reverse=True)[:most]
    return {
        "kernels": len(kernels),
        "span_ms": (last.end_us - ordered[0].start_us) / 1e3,
        "busy_ms": busy_us / 1e3,
        "idle_ms": idle_us / 1e3,
        "idle_ms_by_transition": {t: {"ms": by_transition[t] / 1e3, "gaps": counts[t]} for t in largest},
    }
