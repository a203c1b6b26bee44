"""The prefill node: computes a prompt's KV cache (batched, chunked, reusing its prefix cache), samples
the first token, and writes the blocks straight into the decode node's reserved ones."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, HTTPException

from kvferry.internal_api import API_PREFIX, PrefillRequest, PrefillResponse
from kvferry.node_runtime import NodeRuntime, add_common_routes
from kvferry.transfer import LayoutMismatchError, TransferError
from kvferry.transfer.kv_connector import DestinationHandle, KVSender


def create_app(runtime: NodeRuntime) -> FastAPI:
    sender = KVSender(runtime.transfer, runtime.engine.engine.pool, runtime.model_name)
    metrics = runtime.metrics
    # Requests prefill() is handling, those of them whose KV is on the wire, and those of them aborted. An
    # abort must not free blocks UCX is still reading from: on the wire, it is honoured when the transfer
    # ends (within the transfer timeout); before, prefill() sees the mark and does not start the transfer.
    active: set[str] = set()
    sending: set[str] = set()
    aborted: set[str] = set()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        runtime.close()

    app = FastAPI(title="kvferry prefill node", lifespan=lifespan)
    add_common_routes(app, runtime)

    @app.post(f"{API_PREFIX}/prefill")
    async def prefill(body: PrefillRequest) -> PrefillResponse:
        active.add(body.request_id)
        try:
            return await prefill_and_send(body)
        finally:
            active.discard(body.request_id)
            aborted.discard(body.request_id)

    async def prefill_and_send(body: PrefillRequest) -> PrefillResponse:
        started = time.perf_counter()
        try:
            handle = DestinationHandle.from_json(body.handle)
            params = body.sampling.to_params(max_tokens=1, n=1)
            stream = await runtime.engine.add_request(
                body.request_id, {"prompt_token_ids": body.prompt_token_ids}, params, hold_kv=True
            )
        except (TypeError, ValueError) as exc:
            raise HTTPException(400, str(exc)) from None
        final = None
        async for output in stream:
            final = output
        if (final is not None and final.outputs[0].finish_reason == "abort") or body.request_id in aborted:
            # An abort that came after the prompt's last step found the KV held: its blocks go now.
            await runtime.engine.call(lambda engine: engine.release_kv(body.request_id))
            raise HTTPException(409, f"request {body.request_id!r} was aborted")
        if final is None or final.kv_block_ids is None:
            raise HTTPException(500, f"prefill of {body.request_id!r} produced no KV")
        prefilled = time.perf_counter()
        sending.add(body.request_id)
        try:
            # The write blocks until the decode node confirms or the transfer timeout passes.
            kv_bytes = await asyncio.to_thread(sender.send_blocks, body.request_id, final.kv_block_ids, handle)
        except LayoutMismatchError as exc:
            raise HTTPException(409, str(exc)) from None
        except TransferError as exc:
            metrics.transfer_failures.inc()
            raise HTTPException(502, f"KV transfer to {handle.node} failed: {exc}") from None
        finally:
            sending.discard(body.request_id)
            await runtime.engine.call(lambda engine: engine.release_kv(body.request_id))
        if body.request_id in aborted:
            raise HTTPException(409, f"request {body.request_id!r} was aborted")
        transferred = time.perf_counter()
        queued = final.queue_seconds or 0.0
        metrics.observe_ttft("queue", queued)
        metrics.observe_ttft("prefill", prefilled - started - queued)
        metrics.observe_ttft("transfer", transferred - prefilled)
        metrics.observe_prefix(len(body.prompt_token_ids), final.num_cached_tokens)
        metrics.transfer_seconds.observe(transferred - prefilled)
        metrics.transfer_bytes.inc(kv_bytes)
        completion = final.outputs[0]
        return PrefillResponse(
            first_token=completion.token_ids[0],
            logprobs=completion.logprobs[0] if completion.logprobs else None,
            kv_bytes=kv_bytes,
            prefill_ms=1e3 * (prefilled - started),
            transfer_ms=1e3 * (transferred - prefilled),
        )

    @app.post(f"{API_PREFIX}/abort/{{request_id}}")
    async def abort(request_id: str) -> dict[str, bool]:
        # Marked on the event loop, where prefill() moves a request from the engine to the wire, so exactly
        # one of the two rules above applies.
        if request_id in active:
            aborted.add(request_id)
            if request_id in sending:  # out of the engine already: counted here
                metrics.aborts.inc()
                return {"aborted": True}
        # The engine lock is held for whole steps (seconds on a CPU): waited for off the event loop, which
        # keeps serving streams, probes and /metrics meanwhile. Done on the loop, a router's burst of
        # aborts (prefills past its timeout) blocked the node for a step each: /metrics reads timed out.
        return {"aborted": await asyncio.to_thread(runtime.engine.abort, request_id)}

    return app
