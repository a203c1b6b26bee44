"""The decode side of the KV connector: one owner for a request's KV from reservation to decoding.

    reserve -> lease open, handle out -> blocks arrive (or the lease ends, or the prefill fails)
            -> claim + activate: decode from the arrived KV     | fall back: prefill here, same stream
    abort at any point frees whatever the request holds (reservation, lease or running sequence).

The engine is called at fixed points only (reserve, activate, cancel_reservation, add_request, abort);
the transport is transfer/kv_connector.py's KVReceiver (leases enforced by the transfer engine's write
guard). The HTTP routes (server.py) only translate to and from these calls.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import Enum

from kvferry.engine import AsyncLLMEngine, RequestOutput, SamplingParams
from kvferry.node.metrics import NodeMetrics
from kvferry.node.runtime import NodeRuntime
from kvferry.transfer.kv_connector import DestinationHandle, KVReceiver

log = logging.getLogger(__name__)

LEASE_SWEEP_SECONDS = 0.25


class KVOutcome(Enum):
    ARRIVED = "arrived"
    NOT_ARRIVED = "kv_not_arrived"  # the lease ended first: expired, or a write into it failed
    PREFILL_FAILED = "prefill_failed"  # the router saw the prefill node fail: no KV will come
    ABORTED = "aborted"


@dataclass
class _Reservation:
    handle: DestinationHandle
    outcome: asyncio.Future[KVOutcome]
    loop: asyncio.AbstractEventLoop
    aborted: bool = False  # set by abort even when the KV's arrival settled the outcome first

    def settle(self, outcome: KVOutcome) -> None:
        """From any thread; the first outcome wins."""

        def settle_on_loop() -> None:
            if not self.outcome.done():
                self.outcome.set_result(outcome)

        self.loop.call_soon_threadsafe(settle_on_loop)


@dataclass(frozen=True)
class DecodeStream:
    outputs: AsyncIterator[RequestOutput]
    local_prefill: str | None  # why this node prefilled the prompt itself, or None: the KV came over


class DecodeConnector:
    def __init__(self, runtime: NodeRuntime) -> None:
        self.engine: AsyncLLMEngine = runtime.engine
        self.metrics: NodeMetrics = runtime.metrics
        self.block_size = runtime.pool.block_size
        self.receiver = KVReceiver(
            runtime.transfer, runtime.pool, runtime.model_name, runtime.config.lease_seconds,
            on_expired=self._lease_expired, on_received=self.metrics.received_bytes.inc,
            on_completed=lambda request_id: self._settle(request_id, KVOutcome.ARRIVED),
        )
        self._reservations: dict[str, _Reservation] = {}
        self._lock = threading.Lock()  # the transfer engine's and the sweep's threads settle reservations
        self._sweeper: asyncio.Task | None = None

    async def start(self) -> None:
        async def sweep() -> None:  # leases end on time even when nobody asks about them
            while True:
                await asyncio.sleep(LEASE_SWEEP_SECONDS)
                # Off the event loop: freeing an expired reservation waits for the engine's step in progress.
                await asyncio.to_thread(self.receiver.expire_due)

        self._sweeper = asyncio.create_task(sweep())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()

    async def reserve(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                      resumed: list[int]) -> DestinationHandle:
        """Allocate the prompt's blocks (and any resumed outputs') after those this node's prefix cache holds
        and open a lease on them. Raises OutOfBlocksError (no room now) or ValueError (bad input)."""
        prompt = {"prompt_token_ids": prompt_ids}
        reservation = await self.engine.call(lambda engine: engine.reserve(request_id, prompt, params, resumed))
        loop = asyncio.get_running_loop()
        handle = self.receiver.expect(request_id, reservation.block_ids, reservation.first_block)
        pending = _Reservation(handle, loop.create_future(), loop)
        with self._lock:  # before anyone has the handle, so before any block can arrive
            self._reservations[request_id] = pending
        if not reservation.block_ids:  # this node holds the whole prompt already: nothing will travel
            pending.settle(KVOutcome.ARRIVED)
        self.metrics.observe_prefix(len(prompt_ids), reservation.first_block * self.block_size)
        return handle

    async def decode(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                     resumed: list[int]) -> DecodeStream | None:
        """Wait for the reserved KV, then decode from it; when it does not come, prefill here instead.
        None: the request was aborted meanwhile."""
        with self._lock:
            pending = self._reservations.get(request_id)
        if pending is None:
            return None
        outcome = await pending.outcome
        with self._lock:
            self._reservations.pop(request_id, None)
        if outcome is KVOutcome.ARRIVED and self.receiver.claim(pending.handle):
            return DecodeStream(await self.engine.activate(request_id), None)
        if outcome is KVOutcome.ABORTED or pending.aborted:
            return None
        self.receiver.release(pending.handle)
        await self.engine.call(lambda engine: engine.cancel_reservation(request_id))
        reason = KVOutcome.NOT_ARRIVED if outcome is KVOutcome.ARRIVED else outcome  # claimed too late
        return DecodeStream(await self.prefill_locally(request_id, prompt_ids, params, resumed), reason.value)

    async def prefill_locally(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                              resumed: list[int]) -> AsyncIterator[RequestOutput]:
        """The whole request on this node (no prefill node, or the KV did not come). Raises ValueError."""
        stream = await self.engine.add_request(request_id, {"prompt_token_ids": prompt_ids}, params, resumed=resumed)
        self.metrics.local_prefills.inc()
        return stream

    def prefill_failed(self, request_id: str) -> bool:
        """The router saw the prefill node fail: stop waiting and prefill here now. False: nothing waits."""
        return self._settle(request_id, KVOutcome.PREFILL_FAILED)

    def abort(self, request_id: str) -> bool:
        """Free whatever the request holds here. A reservation given up (the router fell back, or its
        client left during prefill) is counted apart from running requests, which the engine counts."""
        with self._lock:
            pending = self._reservations.pop(request_id, None)
        if pending is not None:
            pending.aborted = True
            self.receiver.release(pending.handle)
        try:
            if self.engine.run_locked(lambda engine: engine.cancel_reservation(request_id)):
                self.metrics.cancelled_reservations.inc()
                return True
            return self.engine.abort(request_id)
        finally:
            # Last: the decode stream this wakes gives up and aborts too, from another thread. Settled first,
            # that second abort could free the reservation before this one, which then answered "nothing to
            # abort" for what it had aborted (test_the_token_opens_the_internal_api, under load).
            if pending is not None:
                pending.settle(KVOutcome.ABORTED)

    def held(self) -> dict[str, int]:
        """Leases and reservations open now (a leak check: 0 on an idle node)."""
        with self._lock:
            return {"leases": self.receiver.open_leases(), "handles": len(self._reservations)}

    def _settle(self, request_id: str, outcome: KVOutcome) -> bool:
        with self._lock:
            pending = self._reservations.get(request_id)
        if pending is None:
            return False
        pending.settle(outcome)
        return True

    def _lease_expired(self, request_id: str, _block_ids: list[int]) -> None:
        """The lease ended without its KV being claimed: free the blocks now (the stream waiting on it, if
        any, prefills locally; with none, nothing else would free them)."""
        log.warning("the lease of %s ended before its KV was claimed (%.1f s): its blocks are freed", request_id,
                    self.receiver.lease_seconds)
        self.engine.run_locked(lambda engine: engine.cancel_reservation(request_id))
        with self._lock:
            pending = self._reservations.pop(request_id, None)
        if pending is not None:
            pending.settle(KVOutcome.NOT_ARRIVED)

