"""The soak benchmark's load: a closed loop of workers cycling through prompts, request modes (streamed,
plain, streamed and left after a few chunks) and endpoint kinds, behind a gate that a sample closes to see
the processes between requests."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import aiohttp
import orjson

from kvferry.loadgen.client import Endpoint, request_body, send_request
from kvferry.loadgen.datasets import BenchRequest

MODE_CYCLE = ("stream", "plain", "stream", "stream", "plain", "stream", "stream", "plain", "stream", "leave")
ENDPOINT_KINDS = ("completions", "chat", "completions")  # 3 is prime to 10: every kind meets every mode
LEAVE_AFTER_CHUNKS = 3
LEAVE_MIN_TOKENS = 24  # a stream to leave runs well past the chunks read before leaving


class Gate:
    """Lets requests start while open; closing it waits for the ones in flight to finish, so that a sample
    sees the processes between requests."""

    def __init__(self) -> None:
        self.inflight = 0
        self._open, self._idle = asyncio.Event(), asyncio.Event()
        self._open.set()
        self._idle.set()

    async def enter(self) -> None:
        await self._open.wait()
        self.inflight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            self._idle.set()

    @asynccontextmanager
    async def closed(self, timeout_s: float) -> AsyncIterator[bool]:
        """Yields whether every request in flight finished within timeout_s."""
        self._open.clear()
        try:
            try:
                await asyncio.wait_for(self._idle.wait(), timeout_s)
                drained = True
            except TimeoutError:
                drained = False
            yield drained
        finally:
            self._open.set()


async def send_plain(client: aiohttp.ClientSession, endpoint: Endpoint, request: BenchRequest) -> str | None:
    """A non-streaming request; its error, or None when it got every token."""
    body = {**request_body(endpoint, request), "stream": False}
    body.pop("stream_options")
    try:
        async with client.post(endpoint.url, json=body) as response:
            text = await response.text()
    except (TimeoutError, aiohttp.ClientError) as exc:
        return f"plain {type(exc).__name__}: {exc}"[:200]
    if response.status != 200:
        return f"plain HTTP {response.status}: {text[:200]}"
    tokens = orjson.loads(text)["usage"]["completion_tokens"]
    return None if tokens == request.output_tokens else f"plain: {tokens} of {request.output_tokens} tokens"


async def send_and_leave(
    client: aiohttp.ClientSession, endpoint: Endpoint, request: BenchRequest
) -> str | None:
    """A stream left after LEAVE_AFTER_CHUNKS chunks (closing the connection); its error, or None once left."""
    try:
        async with client.post(endpoint.url, json=request_body(endpoint, request)) as response:
            if response.status != 200:
                return f"leave HTTP {response.status}: {(await response.read())[:200]!r}"
            chunks = 0
            async for line in response.content:
                if not line.startswith(b"data:") or line.strip().endswith(b"[DONE]"):
                    continue
                if "error" in orjson.loads(line[len(b"data:") :]):
                    return f"leave: error event {line[:200]!r}"
                chunks += 1
                if chunks == LEAVE_AFTER_CHUNKS:
                    return None  # leaving the block closes the connection mid-stream
    except (TimeoutError, aiohttp.ClientError) as exc:
        return f"leave {type(exc).__name__}: {exc}"[:200]
    return f"leave: the stream ended after {chunks} chunks, before the client left"


async def send_stream(client: aiohttp.ClientSession, endpoint: Endpoint, request: BenchRequest) -> str | None:
    record = await send_request(client, endpoint, request, time.perf_counter())
    if record.error is not None:
        return f"stream {record.error}"
    if record.output_tokens != request.output_tokens:
        return f"stream: {record.output_tokens} of {request.output_tokens} tokens"
    return None


SENDERS = {"stream": send_stream, "plain": send_plain, "leave": send_and_leave}


class Load:
    """The closed loop: `concurrency` workers, each sending the next request of the cycle until the end time."""

    def __init__(self, router_url: str, model: str, requests: list[BenchRequest], end: float) -> None:
        self.endpoints = {kind: Endpoint(router_url, model, kind) for kind in set(ENDPOINT_KINDS)}
        self.requests, self.end = requests, end
        self.gate = Gate()
        self.sent = 0
        self.outcomes: Counter[str] = Counter()  # "stream ok", "plain failed", "leave left", ...
        self.errors: Counter[str] = Counter()

    async def worker(self, client: aiohttp.ClientSession, max_requests: int) -> None:
        for _ in range(max_requests):
            if time.monotonic() >= self.end:
                return
            await self.gate.enter()
            try:
                index, self.sent = self.sent, self.sent + 1
                mode = MODE_CYCLE[index % len(MODE_CYCLE)]
                request = self.requests[index % len(self.requests)]
                if mode == "leave":
                    request = replace(request, output_tokens=max(request.output_tokens, LEAVE_MIN_TOKENS))
                endpoint = self.endpoints[ENDPOINT_KINDS[index % len(ENDPOINT_KINDS)]]
                error = await SENDERS[mode](client, endpoint, request)
            finally:
                self.gate.leave()
            self.outcomes[f"{mode} {'failed' if error else 'left' if mode == 'leave' else 'ok'}"] += 1
            if error:
                self.errors[error] += 1

    @property
    def failed(self) -> int:
        return sum(count for outcome, count in self.outcomes.items() if outcome.endswith("failed"))
