"""The prefill node's HTTP routes, a thin adapter over its side of the KV connector (connector.py): a
prompt's KV computed (batched, chunked, reusing its prefix cache) and written straight into the decode
node's reserved blocks."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, HTTPException

from kvferry.internal_api import API_PREFIX, PrefillRequest, PrefillResponse
from kvferry.node.routes import NODE_TELEMETRY, add_common_routes, request_log
from kvferry.node.runtime import NodeRuntime
from kvferry.prefill_node.connector import PrefillAborted, PrefillConnector
from kvferry.transfer import LayoutMismatchError, TransferError
from kvferry.transfer.kv_connector import DestinationHandle


def create_app(runtime: NodeRuntime) -> FastAPI:
    connector = PrefillConnector(runtime)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        runtime.close()

    app = FastAPI(title="kvferry prefill node", lifespan=lifespan, telemetry=NODE_TELEMETRY)
    add_common_routes(app, runtime)

    @app.post(f"{API_PREFIX}/prefill")
    async def prefill(body: PrefillRequest) -> PrefillResponse:
        try:
            handle = DestinationHandle.from_json(body.handle)
            # A resumed request's outputs so far have their KV on the decode node too: computed here as prompt.
            tokens = body.prompt_token_ids + body.resumed_token_ids
            result = await connector.prefill_and_send(body.request_id, tokens, body.sampling.to_params(), handle)
        except (TypeError, ValueError) as exc:
            raise HTTPException(400, str(exc)) from None
        except (PrefillAborted, LayoutMismatchError) as exc:
            raise HTTPException(409, str(exc)) from None
        except TransferError as exc:
            raise HTTPException(502, f"KV transfer to {handle.node} failed: {exc}") from None
        response = PrefillResponse(kv_bytes=result.kv_bytes, computed_tokens=result.computed_tokens,
                                   queue_ms=1e3 * result.queue_seconds, prefill_ms=1e3 * result.prefill_seconds,
                                   transfer_ms=1e3 * result.transfer_seconds)
        request_log.info("prefill sent", extra={"fields": {"node_request_id": body.request_id, "prompt_tokens": len(tokens),
                                                           "to": handle.node, **response.model_dump()}})
        return response

    @app.post(f"{API_PREFIX}/abort/{{request_id}}")
    async def abort(request_id: str) -> dict[str, bool]:
        return {"aborted": await connector.abort(request_id)}

    return app
