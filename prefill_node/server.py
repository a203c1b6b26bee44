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
        if final is None or final.kv_block_ids is None:
            raise HTTPException(500, f"prefill of {body.request_id!r} produced no KV")
        prefilled = time.perf_counter()
        try:
            # The write blocks until the decode node confirms or the transfer timeout passes.
            kv_bytes = await asyncio.to_thread(sender.send_blocks, body.request_id, final.kv_block_ids, handle)
        except LayoutMismatchError as exc:
            raise HTTPException(409, str(exc)) from None
        except TransferError as exc:
            raise HTTPException(502, f"KV transfer to {handle.node} failed: {exc}") from None
        finally:
            runtime.engine.run_locked(lambda engine: engine.release_kv(body.request_id))
        completion = final.outputs[0]
        return PrefillResponse(
            first_token=completion.token_ids[0],
            logprobs=completion.logprobs[0] if completion.logprobs else None,
            kv_bytes=kv_bytes,
            prefill_ms=1e3 * (prefilled - started),
            transfer_ms=1e3 * (time.perf_counter() - prefilled),
        )

    return app
