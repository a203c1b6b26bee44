"""One streaming OpenAI request and its timings: first token, each later token, the end.

Streams are read through aiohttp, as vLLM's serving benchmark reads them and as the router reads its node
streams (router/dispatch/node_streams.py). On the core it shares with the router under test, the load generator's
own cost per token is what a benchmark measures as the router's: httpx took 84-120 us of CPU per streamed
chunk at 64 streams (a pure-Python HTTP reader, an anyio cancel scope and a poller registration per read, a
scan of its pool per request), aiohttp 31-34 us (C HTTP parser), on the same stream of chunks.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import orjson

from kvferry.internal_api import API_PREFIX
from kvferry.loadgen.datasets import BenchRequest

# "node": a decode node's own generate call (internal API, NDJSON), to measure what the router adds.
ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "node": f"{API_PREFIX}/generate"}


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
    output_tokens: int = 0  # the server's usage count; else max_tokens for a "length" finish; else chunks
    start_s: float = 0.0  # since the run began
    ttft_s: float | None = None
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)  # gaps between chunks that carry tokens
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first; None when there is no second token."""
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


def request_body(endpoint: Endpoint, request: BenchRequest) -> dict[str, object]:
    if endpoint.kind == "node":
        if request.prompt_token_ids is None:
            raise ValueError("the node API takes token ids: build the requests with with_token_ids()")
        sampling = {"max_tokens": request.output_tokens, "ignore_eos": True, "temperature": 0.0}
        return {"request_id": f"bench-{uuid.uuid4().hex}", "prompt_token_ids": list(request.prompt_token_ids), "sampling": sampling}
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


@dataclass(frozen=True)
class ChunkReading:
    """What one streamed chunk says, whichever API sent it."""

    has_token: bool  # it carries output (text, or token ids on the node API)
    tokens: int | None = None  # output tokens it carries, when the API says (the node API does)
    finish_reason: str | None = None
    usage_tokens: int | None = None  # OpenAI's final usage chunk
    error: str | None = None


def _carries_token(choice: dict) -> bool:
    """A streamed choice carries a generated token when it has text, or when it has no finish reason: a
    token whose text the detokenizer holds back (part of a UTF-8 character, a skipped special token) still
    arrives, as an empty chunk, and vLLM's serving benchmark counts it too. Counting text alone, a random
    model's 128k-token vocabulary delayed TTFT by many tokens and made TPOT a third of the decode step.
    Chat's opening role delta and closing empty delta carry none."""
    delta = choice.get("delta")
    text = choice.get("text") if delta is None else delta.get("content")
    return bool(text) or (choice.get("finish_reason") is None and (delta is None or "role" not in delta))


def _read_openai(chunk: dict) -> ChunkReading:
    if "error" in chunk:
        return ChunkReading(False, error=str(chunk["error"])[:200])
    choices = chunk.get("choices") or []
    finish = next((c["finish_reason"] for c in choices if c.get("finish_reason")), None)
    usage = (chunk.get("usage") or {}).get("completion_tokens")
    return ChunkReading(any(_carries_token(choice) for choice in choices), finish_reason=finish, usage_tokens=usage)


def _read_node(chunk: dict) -> ChunkReading:
    token_ids = chunk.get("token_ids") or []
    return ChunkReading(bool(token_ids), len(token_ids), chunk.get("finish_reason"), error=chunk.get("error"))


async def _chunks(content: aiohttp.StreamReader, kind: str) -> AsyncIterator[ChunkReading]:
    # orjson: every token of every stream is parsed here, on the core the benchmarks share with the router.
    async for line in content:  # lines however the bytes fall, ending in b"\n" (the last may not)
        if kind == "node":  # NDJSON: one chunk a line
            if line.strip():
                yield _read_node(orjson.loads(line))
            continue
        if not line.startswith(b"data:"):
            continue
        data = line[len(b"data:") :].strip()
        if data == b"[DONE]":
            return
        yield _read_openai(orjson.loads(data))


def client_session(connections: int, timeout_s: float, keep_alive: bool = True) -> aiohttp.ClientSession:
    """A session for `connections` concurrent requests (0: no limit); `timeout_s` bounds one request. Kept
    alive, as a steady client's, connections do not make the server pay a new one per request; without,
    every request comes on a new connection, as from many clients."""
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout_s, sock_connect=10.0),
        connector=aiohttp.TCPConnector(limit=connections, force_close=not keep_alive),
    )


async def send_request(session: aiohttp.ClientSession, endpoint: Endpoint, request: BenchRequest, run_start: float) -> RequestRecord:
    record = RequestRecord(input_tokens=request.input_tokens)
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    start = time.perf_counter()
    record.start_s = start - run_start
    last = start
    token_chunks, counted_tokens = 0, 0
    usage_tokens: int | None = None
    finish_reason: str | None = None
    try:
        async with session.post(endpoint.url, data=orjson.dumps(request_body(endpoint, request)),
                                headers={**headers, "Content-Type": "application/json"}) as response:
            if response.status != 200:
                record.error = f"HTTP {response.status}: {(await response.read()).decode(errors='replace')[:200]}"
                return record
            async for reading in _chunks(response.content, endpoint.kind):
                if reading.error is not None:
                    record.error = reading.error
                    return record
                usage_tokens = reading.usage_tokens if reading.usage_tokens is not None else usage_tokens
                finish_reason = reading.finish_reason or finish_reason
                counted_tokens += reading.tokens or 0
                if reading.has_token:
                    now = time.perf_counter()
                    if record.ttft_s is None:
                        record.ttft_s = now - start
                    else:
                        record.itl_s.append(now - last)
                    last = now
                    token_chunks += 1
    except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:200]
        return record
    finally:
        record.latency_s = time.perf_counter() - start
    if usage_tokens is not None or counted_tokens:
        record.output_tokens = usage_tokens if usage_tokens is not None else counted_tokens
    else:  # a chunk may carry several tokens (a node step's, relayed together), so chunks can undercount
        record.output_tokens = request.output_tokens if finish_reason == "length" else token_chunks
    if record.ttft_s is None:
        record.error = "the stream ended without a token"
    return record
