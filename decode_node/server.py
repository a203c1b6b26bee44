"""The decode node's HTTP routes, a thin adapter over its side of the KV connector (connector.py):
/decode reserves blocks for KV a prefill node sends and streams the tokens decoded from it (NDJSON, its
first line the reservation's handle), /generate prefills here, /prefill_failed and /abort end a wait."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import anyio
from fastapi import FastAPI, HTTPException

from kvferry.closing_response import ClosingStreamingResponse
from kvferry.decode_node.connector import DecodeConnector
from kvferry.engine import RequestOutput, SamplingParams
from kvferry.internal_api import API_PREFIX, PromptRequest, ReservedKV
from kvferry.kvcache import OutOfBlocksError
from kvferry.node.metrics import NodeMetrics
from kvferry.node.routes import add_common_routes, request_log
from kvferry.node.runtime import NodeRuntime
from kvferry.node.streaming import error_line, ndjson_deltas

NDJSON = "application/x-ndjson"


async def _timing_first_decode(
    stream: AsyncIterator[RequestOutput], metrics: NodeMetrics, activated: float
) -> AsyncIterator[RequestOutput]:
    """Pass a stream through, timing the first token (this node computes it from the arrived KV)."""
    first = True
    try:
        async for output in stream:
            if first:
                metrics.observe_ttft("first_decode", time.perf_counter() - activated)
                first = False
            yield output
    finally:
        await stream.aclose()  # type: ignore[attr-defined]  # at once, as ndjson_deltas does


def _params(body: PromptRequest) -> SamplingParams:
    try:
        return body.sampling.to_params()
    except (TypeError, ValueError) as exc:
        raise HTTPException(400, str(exc)) from None


def create_app(runtime: NodeRuntime) -> FastAPI:
    connector = DecodeConnector(runtime)
    metrics = runtime.metrics

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await connector.start()
        yield
        await connector.stop()
        runtime.close()

    app = FastAPI(title="kvferry decode node", lifespan=lifespan)
    add_common_routes(app, runtime, connector.held)

    @app.post(f"{API_PREFIX}/decode")
    async def decode(body: PromptRequest) -> ClosingStreamingResponse:
        params = _params(body)
        try:
            handle = await connector.reserve(body.request_id, body.prompt_token_ids, params, body.resumed_token_ids)
        except OutOfBlocksError as exc:
            raise HTTPException(503, str(exc)) from None
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        reserved = ReservedKV(handle=handle.to_json(), cached_blocks=handle.first_block)
        request_log.info("decode reserved", extra={"fields": {
            "node_request_id": body.request_id, "prompt_tokens": len(body.prompt_token_ids),
            "resumed_tokens": len(body.resumed_token_ids), "cached_blocks": handle.first_block}})
        return ClosingStreamingResponse(decode_lines(body, params, reserved), media_type=NDJSON)

    async def decode_lines(body: PromptRequest, params: SamplingParams, reserved: ReservedKV) -> AsyncIterator[bytes]:
        streaming = False
        try:
            yield (reserved.model_dump_json() + "\n").encode()
            try:
                stream = await connector.decode(body.request_id, body.prompt_token_ids, params, body.resumed_token_ids)
            except Exception as exc:  # noqa: BLE001 - the engine died: reported in-band, as mid-stream
                yield error_line(exc)
                return
            if stream is None:  # aborted while the KV was on its way
                return
            streaming = True
            outputs = stream.outputs if stream.local_prefill else _timing_first_decode(stream.outputs, metrics, time.perf_counter())
            async with contextlib.aclosing(ndjson_deltas(outputs, stream.local_prefill)) as lines:
                async for line in lines:
                    yield line
        finally:
            if not streaming:  # the reader left before decoding began: free the reservation
                # Shielded: a reader that left cancels this response, and its cancel scope would cancel
                # every await here too, the abort's among them.
                with anyio.CancelScope(shield=True):
                    await asyncio.to_thread(connector.abort, body.request_id)

    @app.post(f"{API_PREFIX}/generate")
    async def generate(body: PromptRequest) -> ClosingStreamingResponse:
        try:
            stream = await connector.prefill_locally(body.request_id, body.prompt_token_ids, _params(body),
                                                     body.resumed_token_ids)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        return ClosingStreamingResponse(ndjson_deltas(stream), media_type=NDJSON)

    @app.post(f"{API_PREFIX}/prefill_failed/{{request_id}}")
    def prefill_failed(request_id: str) -> dict[str, bool]:
        return {"waiting": connector.prefill_failed(request_id)}

    @app.post(f"{API_PREFIX}/abort/{{request_id}}")
    def abort(request_id: str) -> dict[str, bool]:
        return {"aborted": connector.abort(request_id)}

    return app
