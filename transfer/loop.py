"""The one thread that drives an engine's UCX worker.

UCX and the operation tables are single-threaded: every call into them is a command run on this thread,
and callers wait on futures. Between commands the loop takes one turn of the engine (the messages that
arrived, then every operation) and either progresses the worker or sleeps in epoll until a message or a
command comes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from kvferry.transfer import ucp_direct
from kvferry.transfer.ucx import UcxWorker

log = logging.getLogger(__name__)


def run_safely(fn: Callable[[], object]) -> None:
    # The loop must outlive any one bad command or message; the failing operation reports through its
    # own future where it has one.
    try:
        fn()
    except Exception:
        log.exception("transfer engine loop step failed")


def turn_safely(turn: Callable[[], bool]) -> bool:
    """A turn that raised is logged, and counts as one with requests in flight (the next turn comes at once):
    an exception out of a turn once ended this thread, and every later transfer of the node waited forever."""
    try:
        return turn()
    except Exception:
        log.exception("transfer engine turn failed")
        return True


class EngineLoop:
    def __init__(self, closing: threading.Event, idle_wait_ms: int, reply_spin_us: int) -> None:
        self._closing = closing
        self._idle_wait_ms = idle_wait_ms
        self._reply_spin_s = reply_spin_us / 1e6
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._worker: UcxWorker | None = None
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(
        self, name: str, worker: UcxWorker, turn: Callable[[], bool], awaiting_reply: Callable[[], bool],
        finish: Callable[[], None],
    ) -> None:
        """`turn` runs once per loop and says whether requests of ours are in flight; `awaiting_reply` whether
        an operation of ours waits for a peer's answer; `finish` runs once at the end."""
        self._worker = worker
        self._thread = threading.Thread(target=self._run, args=(worker, turn, awaiting_reply, finish), name=name,
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def submit(self, command: Callable[[], None]) -> None:
        """Queue a command for the loop thread and wake it: sleeping in epoll, it would otherwise take
        the command up to idle_wait_ms late (a millisecond per batch is a tenth of a 64 MiB write)."""
        self._commands.put(command)
        if self._worker is not None and self._thread is not None:
            ucp_direct.wake(self._worker.handle)

    def call(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the loop thread and wait for it (at once where no loop runs yet, or on the loop itself)."""
        if self._thread is None or threading.current_thread() is self._thread:
            fn()
            return
        done: Future[None] = Future()

        def run() -> None:
            try:
                fn()
                done.set_result(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.set_exception(exc)

        self.submit(run)
        done.result()

    def close(self) -> None:
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(
        self, worker: UcxWorker, turn: Callable[[], bool], awaiting_reply: Callable[[], bool], finish: Callable[[], None]
    ) -> None:
        last_busy = 0.0
        while not self._closing.is_set():
            while not self._commands.empty():
                run_safely(self._commands.get())
            if turn_safely(turn) or not self._commands.empty():
                worker.progress()  # our requests in flight move only while this thread progresses
                last_busy = time.monotonic()
            elif time.monotonic() - last_busy < self._reply_spin_s and awaiting_reply():
                # A reply is due soon after our last request completed (a write's write_done): polled
                # for, a while, so that it is handled as it lands rather than after a wake from epoll.
                # Bounded from the last busy turn, so a peer that never answers costs no more.
                worker.progress()
            else:
                # Only a peer's message (a reply, a write) or a command can come next: sleep in epoll
                # until it does. A message wakes it over shared memory too (UCX signals an armed
                # receiver), a command through ucp_worker_signal; idle_wait_ms bounds how late a
                # deadline is seen. Polling with backoff instead (up to 400 us) put one to three
                # polling delays into every write.
                worker.wait_for_events(self._idle_wait_ms)
        finish()
