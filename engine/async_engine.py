"""The engine for the servers: a background thread steps the engine while requests stream over asyncio.

`add_request` returns an async iterator of cumulative RequestOutputs; leaving the iterator early (a
client that disconnects) aborts the request, so its blocks are freed at once.

The engine thread holds the lock for a whole step (a long prefill takes seconds on a CPU). Every call the
event loop makes waits for the lock in a worker thread (`add_request`, `activate`, `call`, closing a
stream), so one new request cannot freeze a node's loop for a step: before, a prefill node
answered neither its streams nor its health probes while a prefill ran, and a router ejected it.

Calls go before the next step: the engine thread, which still holds the GIL when a step ends, would
otherwise win the lock back at once, and a waiting call lost that race for up to 91 steps in a row (a
node's /metrics read timed out behind seconds of prefills; load reports and prefix-index events went
stale).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from kvferry.engine.engine_args import EngineArgs
from kvferry.engine.llm_engine import LLMEngine, PromptInput
from kvferry.engine.outputs import RequestOutput
from kvferry.engine.sampling_params import SamplingParams

T = TypeVar("T")


class EngineDeadError(RuntimeError):
    """The engine loop raised; every request in flight gets this error and no new one is taken."""


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine, on_abort: Callable[[], None] | None = None,
                 on_step: Callable[[float], None] | None = None) -> None:
        """`on_abort` runs once for each request an abort stopped (a metric), however the abort came;
        `on_step` after each step with its wall seconds (a metric: the node's busy time)."""
        self.engine = engine
        self._on_abort = on_abort
        self._on_step = on_step
        self._lock = threading.Condition()
        # Calls waiting for the lock; the engine thread lets them all in before it steps again.
        self._waiting_calls = 0
        self._count_lock = threading.Lock()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[RequestOutput | BaseException]]] = {}
        self._stopping = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="kvferry-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_model(cls, model_dir: str | Path, **engine_args: Any) -> AsyncLLMEngine:
        return cls(LLMEngine(model_dir, EngineArgs(**engine_args)))

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and (self._waiting_calls or not self.engine.has_unfinished_requests()):
                    self._lock.wait()
                if self._stopping:
                    return
                try:
                    started = time.perf_counter()
                    outputs = self.engine.step()
                    if self._on_step is not None:
                        self._on_step(time.perf_counter() - started)
                except BaseException as exc:  # noqa: BLE001 - every waiter must hear about it
                    self.error = exc
                    self._fail_all(EngineDeadError(f"engine step failed: {exc!r}"))
                    return
                for output in outputs:
                    self._deliver(output.request_id, output)

    @contextmanager
    def _between_steps(self) -> Iterator[None]:
        """Hold the engine lock for a call, ahead of the engine's next step."""
        with self._count_lock:
            self._waiting_calls += 1
        with self._lock:
            try:
                yield
            finally:
                with self._count_lock:
                    self._waiting_calls -= 1
                self._lock.notify()  # the engine thread, the only one that waits on the condition

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        target = self._queues.get(request_id)
        if target is not None:
            loop, queue = target
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def _fail_all(self, error: BaseException) -> None:
        for request_id in list(self._queues):
            self._deliver(request_id, error)

    async def add_request(
        self, request_id: str, prompt: PromptInput, params: SamplingParams | None = None, hold_kv: bool = False,
        resumed: list[int] | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Validates and queues (raising ValueError for bad input); iterate for outputs."""
        return await self._start(request_id, lambda: self.engine.add_request(request_id, prompt, params, hold_kv, resumed))

    async def activate(self, request_id: str) -> AsyncIterator[RequestOutput]:
        """Decode side: start decoding a reserved request whose KV arrived (LLMEngine.activate)."""
        return await self._start(request_id, lambda: self.engine.activate(request_id))

    async def _start(self, request_id: str, begin: Callable[[], RequestOutput | None]) -> AsyncIterator[RequestOutput]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

        def locked() -> None:
            with self._between_steps():
                if self.error is not None:
                    raise EngineDeadError(f"engine is dead: {self.error!r}")
                first = begin()
                if first is not None:  # from this thread: delivered on the loop, in order with later outputs
                    loop.call_soon_threadsafe(queue.put_nowait, first)
                if first is None or not first.finished:
                    self._queues[request_id] = (loop, queue)

        added = loop.run_in_executor(None, locked)
        try:
            # Shielded (_shielded_abort says why): a caller cancelled while `locked` waits for the step in progress
            # must not leave the request it adds running with nobody to read or abort it.
            await asyncio.shield(added)
        except asyncio.CancelledError:
            added.add_done_callback(lambda done: self._abandon(request_id, done))
            raise
        return self._stream(request_id, queue)

    def _abandon(self, request_id: str, added: asyncio.Future[None]) -> None:
        """A request whose caller left before it had its stream: aborted once added (on the loop)."""
        if not added.cancelled() and added.exception() is None:
            self._queues.pop(request_id, None)
            self._shielded_abort(request_id)

    def run_locked(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run a short synchronous engine call (reserve, release_kv, stats) between two steps."""
        with self._between_steps():
            return fn(self.engine)

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """run_locked for the event loop: waits for the step in progress in a worker thread."""
        return await asyncio.to_thread(self.run_locked, fn)

    async def _stream(
        self, request_id: str, queue: asyncio.Queue[RequestOutput | BaseException]
    ) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                await self._shielded_abort(request_id)

    def _shielded_abort(self, request_id: str) -> asyncio.Future[bool]:
        """Abort in a worker thread, and the abort happens even when the awaiting task is cancelled. A reader that
        leaves is cancelled (Starlette's response cancels its scope when the client disconnects, and anyio then
        cancels every await in it at once): a plain to_thread was cancelled with it, before a worker had taken it
        when the pool was busy, and the request ran on unread to max_tokens, its blocks in use (a router killed
        under load left its decode nodes running for 30 s: tests/e2e/test_shared_state_faults.py)."""
        return asyncio.shield(asyncio.get_running_loop().run_in_executor(None, self.abort, request_id))

    def abort(self, request_id: str) -> bool:
        """Stop a request; a stream still waiting on it gets its last output (finish_reason "abort").
        False when there was nothing to stop."""
        with self._between_steps():
            output = self.engine.abort_request(request_id)
            if output is None:
                return False
            self._deliver(request_id, output)
        if self._on_abort is not None:
            self._on_abort()
        return True

    def shutdown(self) -> None:
        with self._between_steps():
            self._stopping = True
        self._thread.join(timeout=10)
