"""The prefill node: computes a prompt's KV cache (batched, chunked, reusing its prefix cache), samples
the first token, and writes the blocks straight into the decode node's reserved ones."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, HTTPException
from kvferry.transfer import LayoutMismatchError, TransferError
from kvferry.transfer.kv_connector import DestinationHandle, KVSender

from kvferry.internal_api import API_PREFIX, PrefillRequest, PrefillResponse
from kvferry.node_runtime import NodeRuntime, add_common_routes


def create_app(runtime: NodeRuntime) -> FastAPI:
    sender = KVSender(runtime.transfer, runtime.engine.engine.pool, runtime.model_name)
    metrics = runtime.metrics
    # Requests whose KV is on the wire: an abort must not free blocks UCX is still reading from, so it
    # is recorded and honoured when the transfer ends (within the transfer timeout).
    sending: set[str] = set()
    aborted_while_sending: set[str] = set()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        runtime.close()

    app = FastAPI(title="kvferry prefill node", lifespan=lifespan)
    add_common_routes(app, runtime)

    @app.post(f"{API_PREFIX}/prefill")
    async def prefill(body: PrefillRequest) -> PrefillResponse:
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
        if final is not None and final.outputs[0].finish_reason == "abort":
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
        if body.request_id in aborted_while_sending:
            aborted_while_sending.discard(body.request_id)
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
    async def abort(request_id: str) -> dict[str, bool]:  # on the event loop, like prefill(): no races
        if request_id in sending:  # out of the engine already: counted here
            aborted_while_sending.add(request_id)
            metrics.aborts.inc()
            return {"aborted": True}
        return {"aborted": runtime.engine.abort(request_id)}

    return app
