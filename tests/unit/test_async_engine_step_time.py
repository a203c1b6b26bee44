"""The engine thread hands each step's wall time to `on_step` (a node's `kvferry:busy_seconds_total`)."""

from __future__ import annotations

import threading
import time

from kvferry.engine import AsyncLLMEngine

STEP_S = 0.05


class _TwoSteps:
    """An engine stand-in with two steps of work: each takes STEP_S."""

    def __init__(self) -> None:
        self.left = 2

    def has_unfinished_requests(self) -> bool:
        return self.left > 0

    def step(self) -> list:
        time.sleep(STEP_S)
        self.left -= 1
        return []


def test_each_steps_seconds_reach_on_step():
    steps: list[float] = []
    done = threading.Event()

    def on_step(seconds: float) -> None:
        steps.append(seconds)
        if len(steps) == 2:
            done.set()

    engine = AsyncLLMEngine(_TwoSteps(), on_step=on_step)  # type: ignore[arg-type]
    try:
        assert done.wait(timeout=10)
    finally:
        engine.shutdown()
    assert len(steps) == 2 and all(STEP_S <= seconds < STEP_S + 1.0 for seconds in steps)
