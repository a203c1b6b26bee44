"""Warm-up runs before timed ones: first calls allocate, compile and fill caches, which no timed run
should include."""

from __future__ import annotations

import time
from collections.abc import Callable


def warm_up(run: Callable[[], object], times: int = 1) -> None:
    for _ in range(times):
        run()


def timed_runs(run: Callable[[], object], runs: int, warmup: int = 1) -> list[float]:
    """Seconds of each of `runs` calls of `run`, after `warmup` untimed ones (wall clock)."""
    warm_up(run, warmup)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return times
