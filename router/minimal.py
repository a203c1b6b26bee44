"""A minimal OpenAI-compatible router over static node lists (the full router is issue [6]).

/v1/completions: tokenize, pick a prefill and a decode node round-robin, reserve on D, prefill on P
(which ships the KV to D), then stream D's tokens. If P fails (5xx, unreachable) D prefills locally,
counted in /stats; a 4xx from P is passed through unchanged.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from kvferry.engine.tokenizer import ModelTokenizer
from pydantic import BaseModel, ConfigDict

from kvferry.internal_api import API_PREFIX, SamplingSpec


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    prompt: str | list[int]
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    stream: bool = False


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def create_app(model_dir: str, model_name: str, prefill_urls: list[str], decode_urls: list[str]) -> FastAPI:
    tokenizer = ModelTokenizer(Path(model_dir))
    prefill_nodes, decode_nodes = itertools.cycle(prefill_urls), itertools.cycle(decode_urls)
    client = httpx.AsyncClient(timeout=httpx.Timeout(60.0, connect=2.0))
    counters = {"requests": 0, "local_prefill_fallbacks": 0}
    app = FastAPI(title="kvferry router (minimal)")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/stats")
    def stats() -> dict[str, int]:
        return counters

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "kvferry"}]}

    async def token_stream(request_id: str, prompt_ids: list[int], spec: SamplingSpec) -> AsyncIterator[dict]:
        decode_url, prefill_url = next(decode_nodes), next(prefill_nodes)
        reserve = await client.post(f"{decode_url}{API_PREFIX}/reserve", json={"request_id": request_id, "prompt_token_ids": prompt_ids, "sampling": spec.model_dump()})
        if reserve.status_code != 200:
            raise HTTPException(reserve.status_code, reserve.json().get("detail", reserve.text))
        handle = reserve.json()["handle"]
        try:
            prefill = await client.post(f"{prefill_url}{API_PREFIX}/prefill", json={"request_id": request_id, "prompt_token_ids": prompt_ids, "sampling": spec.model_dump(), "handle": handle})
            failed = prefill.status_code >= 500
        except httpx.HTTPError:
            failed = True
        if not failed and prefill.status_code != 200:
            await client.post(f"{decode_url}{API_PREFIX}/abort/{request_id}")
            raise HTTPException(prefill.status_code, prefill.json().get("detail", prefill.text))
        if failed:
            counters["local_prefill_fallbacks"] += 1
            await client.post(f"{decode_url}{API_PREFIX}/abort/{request_id}")
            call = client.stream("POST", f"{decode_url}{API_PREFIX}/generate", json={"request_id": request_id, "prompt_token_ids": prompt_ids, "sampling": spec.model_dump()})
        else:
            first = prefill.json()
            call = client.stream("POST", f"{decode_url}{API_PREFIX}/decode", json={"request_id": request_id, "first_token": first["first_token"], "logprobs": first["logprobs"]})
        async with call as response:
            if response.status_code != 200:
                raise HTTPException(response.status_code, (await response.aread()).decode())
            try:
                async for line in response.aiter_lines():
                    if line:
                        yield json.loads(line)
            finally:  # the client left mid-stream: stop the decode too
                if not response.is_closed:
                    await client.post(f"{decode_url}{API_PREFIX}/abort/{request_id}")

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> JSONResponse | StreamingResponse:
        try:
            body = CompletionRequest.model_validate(await request.json())
            spec = SamplingSpec(max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                                seed=body.seed, stop=[body.stop] if isinstance(body.stop, str) else body.stop or [], ignore_eos=body.ignore_eos)
            spec.to_params()  # the engine's own checks, before any node is called
        except (ValueError, TypeError) as exc:
            return _error(400, str(exc))
        if body.model != model_name:
            return _error(404, f"model {body.model!r} does not exist; this router serves {model_name!r}", "not_found_error")
        prompt_ids = tokenizer.encode(body.prompt) if isinstance(body.prompt, str) else body.prompt
        request_id = f"cmpl-{uuid.uuid4().hex}"
        counters["requests"] += 1
        created = int(time.time())
        stream = token_stream(request_id, prompt_ids, spec)
        if body.stream:
            async def sse() -> AsyncIterator[bytes]:
                async for chunk in stream:
                    data = {"id": request_id, "object": "text_completion", "created": created, "model": model_name,
                            "choices": [{"index": 0, "text": chunk["text"], "finish_reason": chunk["finish_reason"], "logprobs": None}]}
                    yield f"data: {json.dumps(data)}\n\n".encode()
                yield b"data: [DONE]\n\n"
            return StreamingResponse(sse(), media_type="text/event-stream")
        text, token_ids, finish = "", [], None
        try:
            async for chunk in stream:
                text += chunk["text"]
                token_ids += chunk["token_ids"]
                finish = chunk["finish_reason"]
        except HTTPException as exc:
            return _error(exc.status_code, str(exc.detail), "server_error" if exc.status_code >= 500 else "invalid_request_error")
        return JSONResponse({
            "id": request_id, "object": "text_completion", "created": created, "model": model_name,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None, "token_ids": token_ids}],
            "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(token_ids), "total_tokens": len(prompt_ids) + len(token_ids)},
        })

    return app
