"""Offer a list of requests to an endpoint: Poisson arrivals, a trace's own times, or fixed concurrency,
always within a time limit."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvferry.loadgen.client import Endpoint, RequestRecord, client_session, send_request
from kvferry.loadgen.datasets import BenchRequest

TIME_LIMIT_ERROR = "time limit"


@dataclass(frozen=True)
class LoadShape:
    request_rate: float | None = None  # requests/s, Poisson; inf sends all at once; None: the trace's times
    concurrency: int | None = None  # at most this many in flight (alone: a closed loop)
    time_limit_s: float = 600.0  # requests not done by then are cancelled and count as failed
    seed: int = 0

    @property
    def label(self) -> str:
        parts = []
        if self.request_rate is not None:
            parts.append(f"rate {self.request_rate:g}/s")
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        return ", ".join(parts) or "trace times"


@dataclass(frozen=True)
class RunResult:
    shape: LoadShape
    records: list[RequestRecord]
    duration_s: float  # from the first send to the last answer (or the time limit)


def arrival_offsets(requests: list[BenchRequest], shape: LoadShape) -> list[float]:
    """Seconds after the start at which each request is sent."""
    if shape.request_rate is None:
        if shape.concurrency is not None:
            return [0.0] * len(requests)
        if any(request.arrival_s is None for request in requests):
            raise ValueError("without a request rate or a concurrency the requests need arrival times (a trace)")
        return [request.arrival_s for request in requests]  # type: ignore[misc]
    if math.isinf(shape.request_rate):
        return [0.0] * len(requests)
    if shape.request_rate <= 0:
        raise ValueError(f"the request rate must be positive, got {shape.request_rate}")
    rng = random.Random(shape.seed)
    offsets, now = [], 0.0
    for _ in requests:
        offsets.append(now)
        now += rng.expovariate(shape.request_rate)
    return offsets


async def run_load(
    endpoint: Endpoint,
    requests: list[BenchRequest],
    shape: LoadShape,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> RunResult:
    offsets = arrival_offsets(requests, shape)
    limit = asyncio.Semaphore(shape.concurrency) if shape.concurrency else None
    connections = shape.concurrency or len(requests)
    async with client_session(connections, shape.time_limit_s) as client:
        start = time.perf_counter()
        deadline = start + shape.time_limit_s

        async def one(request: BenchRequest) -> RequestRecord:
            try:
                record = await send_request(client, endpoint, request, start)
            finally:
                if limit is not None:
                    limit.release()
            if on_done is not None:
                on_done(record)
            return record

        tasks: list[asyncio.Task[RequestRecord]] = []
        unsent = 0
        for index, (request, offset) in enumerate(zip(requests, offsets, strict=True)):
            wait = start + offset - time.perf_counter()
            if start + offset >= deadline:
                unsent = len(requests) - index
                break
            if wait > 0:
                await asyncio.sleep(wait)
            if limit is not None:
                try:
                    await asyncio.wait_for(limit.acquire(), timeout=max(0.0, deadline - time.perf_counter()))
                except TimeoutError:
                    unsent = len(requests) - index
                    break
            tasks.append(asyncio.create_task(one(request)))
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter())) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        end = time.perf_counter()
        records = []
        for task, request in zip(tasks, requests, strict=False):
            if task in done and task.exception() is None:
                records.append(task.result())
            else:
                error = TIME_LIMIT_ERROR if task in pending else repr(task.exception())
                records.append(RequestRecord(input_tokens=request.input_tokens, latency_s=end - start, error=error))
        records += [RequestRecord(input_tokens=r.input_tokens, error=TIME_LIMIT_ERROR) for r in requests[len(requests) - unsent :]]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        finished = [r.start_s + r.latency_s for r in records if r.error is None]
        duration = max(finished) if finished and not pending and not unsent else end - start
        return RunResult(shape, records, duration)
