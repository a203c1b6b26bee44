"""The prefill side of the KV connector: one owner for a request's KV from its prefill to its release.

    prepare the write into the lease -> prefill (blocks held after the prompt's step) -> send the blocks the
    decode node lacks into its lease -> release the blocks (sent or failed)
                                                      | abort: before the send, nothing is sent (the
                                                        prepared write withdrawn); on the wire, honoured
                                                        when the transfer ends.

The write is prepared before the prefill so that the decode node checks it and readies its memory while
the KV is computed: once it exists the data leaves at once (transfer/prepared_write.py).

An abort must not free blocks UCX is still reading from, so while a request's KV is on the wire its
abort only marks it; the blocks are released when the transfer ends (within the transfer timeout). The
engine is called at fixed points only (add_request with hold_kv, release_kv, abort); the transport is
transfer/kv_connector.py's KVSender. The HTTP route (server.py) only translates to and from these calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass

from kvferry import tracing
from kvferry.engine import AsyncLLMEngine, RequestOutput, SamplingParams
from kvferry.node.metrics import NodeMetrics
from kvferry.node.runtime import NodeRuntime
from kvferry.transfer.errors import LayoutMismatchError, TransferError
from kvferry.transfer.kv_connector import DestinationHandle, KVSender


class PrefillAborted(RuntimeError):
    """The request was aborted before its KV was sent (or while it was on the wire)."""


@dataclass(frozen=True)
class PrefillResult:
    kv_bytes: int
    computed_tokens: int  # the prompt tokens computed here (the rest came from the prefix cache)
    queue_seconds: float  # waiting for the first step
    prefill_seconds: float  # computing, after the queue
    transfer_seconds: float


class PrefillConnector:
    def __init__(self, runtime: NodeRuntime) -> None:
        self.engine: AsyncLLMEngine = runtime.engine
        self.metrics: NodeMetrics = runtime.metrics
        self.sender = KVSender(runtime.transfer, runtime.pool, runtime.model_name)
        # Requests being prefilled, those of them whose KV is on the wire, and those of them aborted; all
        # changed on the event loop only, so an abort and the move to the wire see each other.
        self._active: set[str] = set()
        self._sending: set[str] = set()
        self._aborted: set[str] = set()

    async def prefill_and_send(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                               handle: DestinationHandle) -> PrefillResult:
        """Compute the prompt's KV and write the blocks the decode node lacks into its reserved ones.
        Raises ValueError (bad input), PrefillAborted, LayoutMismatchError or TransferError."""
        if handle.request_id != request_id:
            raise ValueError(f"handle is for request {handle.request_id!r}, not {request_id!r}")
        self._active.add(request_id)
        try:
            return await self._prefill_and_send(request_id, prompt_ids, params, handle)
        finally:
            self._active.discard(request_id)
            self._aborted.discard(request_id)

    async def _prefill_and_send(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                                handle: DestinationHandle) -> PrefillResult:
        started = time.perf_counter()
        prepared = self.sender.prepare(handle)  # a layout mismatch is refused here, before any compute
        try:
            final = await self._prefill(request_id, prompt_ids, params)
        except BaseException:
            if prepared is not None:
                prepared.withdraw()
                self.metrics.prepared_write("withdrawn")
            raise
        prefilled = time.perf_counter()
        self._sending.add(request_id)
        try:
            # The write blocks until the decode node confirms or the transfer timeout passes.
            kv_bytes = await asyncio.to_thread(self.sender.send_blocks, request_id, final.kv_block_ids or [], handle,
                                               prepared)  # fmt: skip
            # The KV is in the decode node's pool, which is decoding from it already: the release below is this
            # node's bookkeeping, not the request's wait (the router's TTFT phases add this node's to D's).
            transferred = time.perf_counter()
        except LayoutMismatchError:
            raise  # refused before any byte moved: a configuration error, not a failed transfer
        except TransferError as exc:
            self.metrics.transfer_failed(exc.reason)
            raise
        finally:
            self._sending.discard(request_id)
            if prepared is not None and prepared.outcome is not None:
                self.metrics.prepared_write(prepared.outcome)
            await self._release(request_id)
        if request_id in self._aborted:
            raise PrefillAborted(f"request {request_id!r} was aborted")
        self._observe(final, len(prompt_ids), started, prefilled, transferred, kv_bytes)
        queued = final.queue_seconds or 0.0
        return PrefillResult(kv_bytes, len(prompt_ids) - final.num_cached_tokens, queued, prefilled - started - queued,
                             transferred - prefilled)

    async def _prefill(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> RequestOutput:
        """The prompt's step(s), its blocks held afterwards. The token sampled here is not used: the decode
        node computes the last prompt position again and samples every token itself (so a grammar, whose
        state starts on the decode node with its first token, has no business here)."""
        one_step = dataclasses.replace(params, max_tokens=1, min_tokens=0, grammar=None, n=1)
        stream = await self.engine.add_request(request_id, {"prompt_token_ids": prompt_ids}, one_step, hold_kv=True)
        final = None
        async for output in stream:
            final = output
        if final is None or final.outputs[0].finish_reason == "abort" or request_id in self._aborted:
            # An abort that came after the prompt's last step found the KV held: its blocks go now.
            await self._release(request_id)
            raise PrefillAborted(f"request {request_id!r} was aborted")
        if final.kv_block_ids is None:
            raise RuntimeError(f"prefill of {request_id!r} produced no KV")
        return final

    async def _release(self, request_id: str) -> None:
        await self.engine.call(lambda engine: engine.release_kv(request_id))

    def _observe(self, final: RequestOutput, prompt_tokens: int, started: float, prefilled: float,
                 transferred: float, kv_bytes: int) -> None:
        queued = final.queue_seconds or 0.0
        self.metrics.observe_ttft("queue", queued)
        self.metrics.observe_ttft("prefill", prefilled - started - queued)
        self.metrics.observe_ttft("transfer", transferred - prefilled)
        # The same phases as spans of the request's trace (the current span is the node's for the call).
        tracing.record_phases([("queue", started, started + queued), ("compute", started + queued, prefilled),
                               ("transfer", prefilled, transferred)],
                              {"kvferry.prompt_tokens": prompt_tokens, "kvferry.cached_tokens": final.num_cached_tokens,
                               "kvferry.kv_bytes": kv_bytes})
        self.metrics.observe_prefix(prompt_tokens, final.num_cached_tokens)
        self.metrics.transfer_seconds.observe(transferred - prefilled)
        self.metrics.transfer_bytes.inc(kv_bytes)

    async def abort(self, request_id: str) -> bool:
        """Stop a prefill; on the wire, the mark is honoured when the transfer ends (see the module doc)."""
        if request_id in self._active:
            self._aborted.add(request_id)
            if request_id in self._sending:  # out of the engine already: counted here
                self.metrics.aborts.inc()
                return True
        # The engine lock is held for whole steps (seconds on a CPU): waited for off the event loop, which
        # keeps serving streams, probes and /metrics meanwhile. Done on the loop, a router's burst of
        # aborts (prefills past its timeout) blocked the node for a step each: /metrics reads timed out.
        return await asyncio.to_thread(self.engine.abort, request_id)
