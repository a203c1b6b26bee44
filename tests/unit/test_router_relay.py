"""The router's token relay, piece by piece: node stream lines in batches, SSE events from templates, the
inter-token histogram observed in bulk, and the streaming response closing its body when the client leaves."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp.base_protocol import BaseProtocol
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from kvferry.closing_response import ClosingStreamingResponse
from kvferry.router.api.completion_shapes import ResponseShape, sse
from kvferry.router.dispatch.node_streams import ndjson_batches
from kvferry.router.metrics import TOKEN_GAP_BUCKETS, BulkHistogram, RouterMetrics, ttft_phases

TEXTS = ["", " the", 'a "quoted" \\ back\nslash', "é 🚀 \x00 \u2028"]


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("with_usage_field", [False, True])
def test_text_events_are_the_chunks_sse_would_write(kind, with_usage_field):
    shape = ResponseShape(kind, "cmpl-1f", 1764720000, "llama \"tiny\"", None, str)
    for index in (0, 3):
        for text in TEXTS:
            general = sse(shape.chunk([shape.delta(index, text, [7], None, None, 0)], with_usage_field))
            assert shape.text_event(index, text, with_usage_field) == general


def _batches(pieces: list[bytes]) -> list[list[dict]]:
    async def read() -> list[list[dict]]:
        loop = asyncio.get_running_loop()
        content = aiohttp.StreamReader(BaseProtocol(loop), 2**16, loop=loop)
        for piece in pieces:
            content.feed_data(piece)
        content.feed_eof()
        return [batch async for batch in ndjson_batches(content)]

    return asyncio.run(read())


def test_node_lines_come_in_batches_of_what_one_read_completed():
    # One piece per read here: a StreamReader hands over everything it holds, so the pieces are fed in turn.
    async def read_in_turns(pieces: list[bytes]) -> list[list[dict]]:
        loop = asyncio.get_running_loop()
        content = aiohttp.StreamReader(BaseProtocol(loop), 2**16, loop=loop)
        batches = ndjson_batches(content)
        seen = []
        for piece in pieces:
            content.feed_data(piece)
            seen.append(await anext(batches))
        content.feed_eof()
        seen += [batch async for batch in batches]
        return seen

    pieces = [b'{"a":1}\n{"a":2}\n{"a', b'":3}\n', b'{"a":4}\n\n{"a":5}\n']
    assert asyncio.run(read_in_turns(pieces)) == [[{"a": 1}, {"a": 2}], [{"a": 3}], [{"a": 4}, {"a": 5}]]


def test_a_last_line_without_newline_and_a_line_over_many_reads_arrive_whole():
    long_text = "x" * 300
    line = f'{{"text":"{long_text}"}}'.encode()
    # The unterminated last line waits for the end of the stream.
    assert _batches([line[:100], line[100:250], line[250:] + b'\n{"a":1}']) == [[{"text": long_text}], [{"a": 1}]]
    assert _batches([b""]) == []


def test_bulk_histogram_exposes_what_prometheus_clients_histogram_does():
    values = [0.0, 0.001, 0.0010001, 0.0049, 0.02, 0.3, 2.5, 7.0, 0.015, 0.015]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    BulkHistogram("kvferry:gap_seconds", "gaps", TOKEN_GAP_BUCKETS, ours).observe_many(values)
    reference = Histogram("kvferry:gap_seconds", "gaps", buckets=TOKEN_GAP_BUCKETS, registry=theirs)
    for value in values:
        reference.observe(value)

    def samples(registry: CollectorRegistry) -> list[str]:
        return [line for line in generate_latest(registry).decode().splitlines() if "gap_seconds_created" not in line]

    assert samples(ours) == samples(theirs)


def test_a_client_that_leaves_stops_the_stream_and_its_cleanup_runs():
    sent: list[bytes] = []
    cleaned = asyncio.Event()

    async def body():
        try:
            for index in range(1000):
                yield f"data: {index}\n\n".encode()
                await asyncio.sleep(0.01)
        finally:
            cleaned.set()

    async def serve() -> None:
        left = asyncio.Event()

        async def receive() -> dict:
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            if message["type"] == "http.response.body":
                sent.append(message["body"])
                if len(sent) == 3:
                    left.set()

        await asyncio.wait_for(ClosingStreamingResponse(body(), media_type="text/event-stream")({"type": "http"}, receive, send), 5)

    asyncio.run(serve())
    assert cleaned.is_set() and 3 <= len(sent) < 10


def test_a_stream_that_fails_fails_its_response():
    async def body():
        yield b"data: 1\n\n"
        raise RuntimeError("node gone")

    async def serve() -> None:
        async def receive() -> dict:
            await asyncio.sleep(10)
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            pass

        await ClosingStreamingResponse(body())({"type": "http"}, receive, send)

    with pytest.raises(RuntimeError, match="node gone"):
        asyncio.run(serve())


def test_a_requests_ttft_phases_take_the_nodes_reports_and_leave_the_rest_to_other():
    first = {"token_ids": [5], "first_step_seconds": 0.2,
             "prefill_phases": {"prefill_queue": 0.1, "prefill_compute": 0.5, "transfer": 0.05}}
    phases = ttft_phases(1.0, 0.03, first)
    assert phases == pytest.approx({"router": 0.03, "prefill_queue": 0.1, "prefill_compute": 0.5, "transfer": 0.05,
                                    "first_step": 0.2, "other": 0.12})
    assert sum(phases.values()) == pytest.approx(1.0)
    # A prompt the decode node prefilled itself: its first step holds the prefill; no prefill phases.
    assert ttft_phases(0.5, 0.01, {"first_step_seconds": 0.45}) == pytest.approx(
        {"router": 0.01, "first_step": 0.45, "other": 0.04})
    # Readings of three clocks that overlap by more than the rest: other is 0, never negative.
    assert ttft_phases(0.5, 0.1, {"first_step_seconds": 0.45})["other"] == 0.0
    metrics = RouterMetrics()
    metrics.observe_ttft_phases(phases)
    text = metrics.exposition().decode()
    assert 'kvferry:router_ttft_phase_seconds_count{phase="other"} 1.0' in text
