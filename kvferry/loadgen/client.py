"""One streaming OpenAI request and its timings: first token, each later token, the end."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from kvferry.loadgen.datasets import BenchRequest

ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    model: str
    kind: str = "completions"  # a key of ENDPOINT_PATHS
    api_key: str | None = None

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + ENDPOINT_PATHS[self.kind]


@dataclass
class RequestRecord:
    input_tokens: int
    output_tokens: int = 0  # the server's usage count; else max_tokens for a "length" finish; else text chunks
    start_s: float = 0.0  # since the run began
    ttft_s: float | None = None
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)  # gaps between chunks with text
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first; None when there is no second token."""
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


def request_body(endpoint: Endpoint, request: BenchRequest) -> dict[str, object]:
    body: dict[str, object] = {
        "model": endpoint.model,
        "max_tokens": request.output_tokens,
        "ignore_eos": True,  # output lengths are the workload's, not the random model's
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint.kind == "chat":
        messages = [{"role": "system", "content": request.system_prompt}] if request.system_prompt else []
        body["messages"] = [*messages, {"role": "user", "content": request.question}]
    else:
        body["prompt"] = request.prompt
    return body


def _chunk_text(choice: dict) -> str:
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


async def send_request(client: httpx.AsyncClient, endpoint: Endpoint, request: BenchRequest, run_start: float) -> RequestRecord:
    record = RequestRecord(input_tokens=request.input_tokens)
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    start = time.perf_counter()
    record.start_s = start - run_start
    last = start
    text_chunks = 0
    usage_tokens: int | None = None
    finish_reason: str | None = None
    try:
        async with client.stream("POST", endpoint.url, json=request_body(endpoint, request), headers=headers) as response:
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {(await response.aread()).decode(errors='replace')[:200]}"
                return record
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    record.error = str(chunk["error"])[:200]
                    return record
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
                choices = chunk.get("choices") or []
                finish_reason = next((c["finish_reason"] for c in choices if c.get("finish_reason")), finish_reason)
                if any(_chunk_text(choice) for choice in choices):
                    now = time.perf_counter()
                    if record.ttft_s is None:
                        record.ttft_s = now - start
                    else:
                        record.itl_s.append(now - last)
                    last = now
                    text_chunks += 1
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:200]
        return record
    finally:
        record.latency_s = time.perf_counter() - start
    if usage_tokens is not None:
        record.output_tokens = usage_tokens
    else:  # a chunk may hold no text (a partial UTF-8 character), so chunks undercount tokens
        record.output_tokens = request.output_tokens if finish_reason == "length" else text_chunks
    if record.ttft_s is None:
        record.error = "the stream ended without a token"
    return record
