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
from opentelemetry import trace
from opentelemetry.trace import Span

from kvferry import tracing
from kvferry.closing_response import ClosingStreamingResponse
from kvferry.decode_node.connector import DecodeConnector
from kvferry.engine import RequestOutput, SamplingParams
from kvferry.internal_api import API_PREFIX, PromptRequest, ReservedKV
from kvferry.kvcache import OutOfBlocksError
from kvferry.node.routes import NODE_TELEMETRY, add_common_routes, request_log
from kvferry.node.runtime import NodeRuntime
from kvferry.node.streaming import FirstToken, error_line, ndjson_deltas

NDJSON = "application/x-ndjson"
Phase = tuple[str, float, float]  # tracing.record_phases': a name, its start and end (time.perf_counter())


async def _traced(stream: AsyncIterator[RequestOutput], first: FirstToken, span: Span,
                  waited: Phase | None = None) -> AsyncIterator[RequestOutput]:
    """Pass a stream through; when it ends, its phases become spans under `span` (tracing): `waited` (the
    wait for the KV), the first step (to `first`'s reading), the stream."""
    try:
        async for output in stream:
            yield output
    finally:
        await stream.aclose()  # type: ignore[attr-defined]  # at once, as ndjson_deltas does
        ended = time.perf_counter()
        first_at = ended if first.at is None else first.at
        tracing.record_phases([*([waited] if waited else []), ("first_step", first.started, first_at),
                               ("stream", first_at, ended)], parent=span)


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

    app = FastAPI(title="kvferry decode node", lifespan=lifespan, telemetry=NODE_TELEMETRY)
    add_common_routes(app, runtime, connector.held)

    @app.post(f"{API_PREFIX}/decode")
    async def decode(body: PromptRequest) -> ClosingStreamingResponse:
        received = time.perf_counter()
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
        return ClosingStreamingResponse(decode_lines(body, params, reserved, received, trace.get_current_span()),
                                        media_type=NDJSON)

    async def decode_lines(body: PromptRequest, params: SamplingParams, reserved: ReservedKV, received: float,
                           span: Span) -> AsyncIterator[bytes]:
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
            activated = time.perf_counter()
            # A local prefill's first step is the prompt's (not a first decode step from KV that arrived).
            first = FirstToken(activated, None if stream.local_prefill else
                               lambda seconds: metrics.observe_ttft("first_decode", seconds))
            outputs = _traced(stream.outputs, first, span, ("kv_wait", received, activated))
            async with contextlib.aclosing(ndjson_deltas(outputs, first, stream.local_prefill)) as lines:
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
        received = time.perf_counter()
        try:
            stream = await connector.prefill_locally(body.request_id, body.prompt_token_ids, _params(body),
                                                     body.resumed_token_ids)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        first = FirstToken(received)
        return ClosingStreamingResponse(ndjson_deltas(_traced(stream, first, trace.get_current_span()), first),
                                        media_type=NDJSON)

    @app.post(f"{API_PREFIX}/prefill_failed/{{request_id}}")
    def prefill_failed(request_id: str) -> dict[str, bool]:
        return {"waiting": connector.prefill_failed(request_id)}

    @app.post(f"{API_PREFIX}/abort/{{request_id}}")
    def abort(request_id: str) -> dict[str, bool]:
        return {"aborted": connector.abort(request_id)}

    return app
