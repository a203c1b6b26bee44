"""The decode node: reserves blocks for KV that a prefill node sends, then decodes with continuous
batching and streams tokens (NDJSON). It can also prefill locally when no prefill node can."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, HTTPException

from kvferry.closing_response import ClosingStreamingResponse
from kvferry.engine import RequestOutput
from kvferry.internal_api import API_PREFIX, DecodeRequest, GenerateRequest, ReserveRequest, ReserveResponse
from kvferry.kvcache import OutOfBlocksError
from kvferry.node_metrics import NodeMetrics
from kvferry.node_runtime import NodeRuntime, add_common_routes, ndjson_deltas
from kvferry.transfer.kv_connector import DestinationHandle, KVReceiver

LEASE_SWEEP_SECONDS = 0.25


async def _timing_first_decode(
    stream: AsyncIterator[RequestOutput], metrics: NodeMetrics, activated: float
) -> AsyncIterator[RequestOutput]:
    """Pass a stream through, timing the first token this node computes (the first output holds only
    the token the prefill node sampled)."""
    seen = 0
    try:
        async for output in stream:
            seen += 1
            if seen == 2:
                metrics.observe_ttft("first_decode", time.perf_counter() - activated)
            yield output
    finally:
        await stream.aclose()  # type: ignore[attr-defined]  # at once, as ndjson_deltas does


def create_app(runtime: NodeRuntime) -> FastAPI:
    handles: dict[str, DestinationHandle] = {}
    metrics = runtime.metrics

    def free_expired(request_id: str, _block_ids: list[int]) -> None:
        handles.pop(request_id, None)
        runtime.engine.run_locked(lambda engine: engine.cancel_reservation(request_id))

    receiver = KVReceiver(
        runtime.transfer, runtime.engine.engine.pool, runtime.model_name, runtime.config.lease_seconds,
        on_expired=free_expired, on_received=metrics.received_bytes.inc,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async def sweep() -> None:  # leases end on time even when nobody asks about them
            while True:
                await asyncio.sleep(LEASE_SWEEP_SECONDS)
                # Off the event loop: freeing an expired reservation waits for the engine's step in progress.
                await asyncio.to_thread(receiver.expire_due)

        task = asyncio.create_task(sweep())
        yield
        task.cancel()
        runtime.close()

    app = FastAPI(title="kvferry decode node", lifespan=lifespan)
    add_common_routes(app, runtime, lambda: {"leases": receiver.open_leases(), "handles": len(handles)})

    @app.post(f"{API_PREFIX}/reserve")
    def reserve(body: ReserveRequest) -> ReserveResponse:
        try:
            params = body.sampling.to_params()
            reservation = runtime.engine.run_locked(
                lambda engine: engine.reserve(body.request_id, {"prompt_token_ids": body.prompt_token_ids}, params)
            )
        except OutOfBlocksError as exc:
            raise HTTPException(503, str(exc)) from None
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        handle = receiver.expect(body.request_id, reservation.block_ids, reservation.first_block)
        handles[body.request_id] = handle
        block_size = runtime.engine.engine.pool_layout.block_size
        metrics.observe_prefix(len(body.prompt_token_ids), reservation.first_block * block_size)
        return ReserveResponse(handle=handle.to_json(), cached_blocks=reservation.first_block)

    @app.post(f"{API_PREFIX}/decode")
    async def decode(body: DecodeRequest) -> ClosingStreamingResponse:
        handle = handles.pop(body.request_id, None)
        if handle is None or not receiver.claim(handle):
            await asyncio.to_thread(free_expired, body.request_id, [])  # waits for the engine's step in progress
            raise HTTPException(409, f"the KV of {body.request_id!r} has not arrived (unknown, expired or cancelled)")
        activated = time.perf_counter()
        stream = await runtime.engine.activate(body.request_id, body.first_token, body.logprobs)
        return ClosingStreamingResponse(
            ndjson_deltas(_timing_first_decode(stream, metrics, activated)), media_type="application/x-ndjson"
        )

    @app.post(f"{API_PREFIX}/generate")
    async def generate(body: GenerateRequest) -> ClosingStreamingResponse:
        try:
            stream = await runtime.engine.add_request(
                body.request_id, {"prompt_token_ids": body.prompt_token_ids}, body.sampling.to_params()
            )
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        metrics.local_prefills.inc()
        return ClosingStreamingResponse(ndjson_deltas(stream), media_type="application/x-ndjson")

    @app.post(f"{API_PREFIX}/abort/{{request_id}}")
    def abort(request_id: str) -> dict[str, bool]:
        handle = handles.pop(request_id, None)
        if handle is not None:
            receiver.release(handle)
        # A reservation given up (the router falls back, or its client left during prefill) is not a
        # request that stopped decoding: counted apart. Running requests count as aborts once, in the
        # engine, whichever comes first: this call or the reader leaving the stream.
        if runtime.engine.run_locked(lambda engine: engine.cancel_reservation(request_id)):
            metrics.cancelled_reservations.inc()
            return {"aborted": True}
        return {"aborted": runtime.engine.abort(request_id)}

    return app
