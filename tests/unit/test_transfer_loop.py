"""The transfer engine's loop thread (transfer/loop.py): when it polls a real UCX worker and when it sleeps in
epoll. Awaiting a peer's reply, it polls for at most reply_spin_us after its last busy turn, so that a reply
is taken as it lands, and a peer that never answers costs no more than that window."""

from __future__ import annotations

import threading
import time

import pytest

from kvferry.transfer.loop import EngineLoop
from kvferry.transfer.ucx import UcxWorker


class CountingWorker(UcxWorker):
    """A real worker whose progress calls and epoll waits are timestamped."""

    def __init__(self) -> None:
        super().__init__()
        self.progressed: list[float] = []
        self.waited: list[float] = []

    def progress(self) -> None:
        self.progressed.append(time.monotonic())
        super().progress()

    def wait_for_events(self, timeout_ms: int) -> None:
        self.waited.append(time.monotonic())
        super().wait_for_events(timeout_ms)


def run_loop(reply_spin_us: int, awaiting_reply: bool, seconds: float = 0.3) -> tuple[CountingWorker, float]:
    """One busy turn, then idle turns for `seconds`; returns the worker and when the busy turn ended."""
    worker, closing = CountingWorker(), threading.Event()
    loop = EngineLoop(closing, idle_wait_ms=1, reply_spin_us=reply_spin_us)
    busy_turns = iter([True])
    loop.start("test-loop", worker, lambda: next(busy_turns, False), lambda: awaiting_reply, lambda: None)
    time.sleep(seconds)
    loop.close()
    return worker, worker.progressed[0]


@pytest.mark.parametrize("window_ms", [20, 60])
def test_a_due_reply_is_polled_for_within_the_window_then_the_loop_sleeps(window_ms):
    worker, busy_at = run_loop(window_ms * 1000, awaiting_reply=True)
    polled_for = worker.progressed[-1] - busy_at
    # Slack for a loaded machine: the thread may be descheduled near either end of the window.
    assert window_ms / 1e3 * 0.5 <= polled_for <= window_ms / 1e3 + 0.025, polled_for
    assert len(worker.progressed) > 50  # polled, not one call per epoll timeout
    slept = [t for t in worker.waited if t > busy_at]
    assert slept and slept[0] >= busy_at + window_ms / 1e3 * 0.5  # and only then slept, and went on sleeping
    assert len(slept) >= 50


def test_without_a_reply_due_the_loop_sleeps_at_once():
    worker, busy_at = run_loop(60_000, awaiting_reply=False)
    assert worker.progressed == [busy_at]
    assert worker.waited and worker.waited[0] - busy_at < 0.05


def test_a_zero_window_never_polls_for_replies():
    worker, busy_at = run_loop(0, awaiting_reply=True)
    assert worker.progressed == [busy_at]
