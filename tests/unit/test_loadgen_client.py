"""The load generator's request bodies and its reading of streamed chunks from each API."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp.base_protocol import BaseProtocol

from kvferry.loadgen.client import Endpoint, _chunks, _read_node, _read_openai, request_body
from kvferry.loadgen.datasets import BenchRequest

REQUEST = BenchRequest(prompt=" sys tem ask", input_tokens=4, output_tokens=5, system_prompt=" sys tem")


def test_completion_and_chat_bodies_stream_exact_lengths():
    completion = request_body(Endpoint("http://h", "m"), REQUEST)
    assert completion["prompt"] == " sys tem ask" and completion["max_tokens"] == 5 and completion["ignore_eos"] is True
    assert completion["stream"] is True and completion["stream_options"] == {"include_usage": True}
    chat = request_body(Endpoint("http://h", "m", kind="chat"), REQUEST)
    assert chat["messages"] == [{"role": "system", "content": " sys tem"}, {"role": "user", "content": " ask"}]
    assert "prompt" not in chat


def test_node_body_needs_token_ids():
    node = Endpoint("http://h", "m", kind="node")
    assert node.url == "http://h/internal/v1/generate"
    with pytest.raises(ValueError, match="token ids"):
        request_body(node, REQUEST)
    body = request_body(node, BenchRequest("x", 3, 2, prompt_token_ids=(1, 2, 3)))
    assert body["prompt_token_ids"] == [1, 2, 3] and body["sampling"]["max_tokens"] == 2


def test_openai_chunks_are_read_for_text_finish_usage_and_errors():
    assert _read_openai({"choices": [{"index": 0, "text": "hi", "finish_reason": None}]}).has_token
    assert _read_openai({"choices": [{"index": 0, "delta": {"content": "hi"}}]}).has_token
    empty = _read_openai({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
    assert not empty.has_token and empty.finish_reason == "length"
    assert _read_openai({"choices": [], "usage": {"completion_tokens": 7}}).usage_tokens == 7
    # A token whose text is held back still arrives; chat's role delta and closing empty delta are not tokens.
    assert _read_openai({"choices": [{"index": 0, "text": "", "finish_reason": None}]}).has_token
    assert _read_openai({"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": None}]}).has_token
    assert not _read_openai({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}).has_token
    assert not _read_openai({"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "stop"}]}).has_token
    assert _read_openai({"error": {"message": "boom"}}).error is not None


def test_node_chunks_count_their_token_ids():
    reading = _read_node({"token_ids": [4, 5], "text": "ab", "finish_reason": None})
    assert reading.has_token and reading.tokens == 2
    assert _read_node({"token_ids": [], "text": "", "finish_reason": "error", "error": "dead"}).error == "dead"


def _read(pieces: list[bytes], kind: str) -> list:
    """What `_chunks` reads from a response body that arrives in these pieces (aiohttp's own stream reader)."""

    async def read() -> list:
        loop = asyncio.get_running_loop()
        content = aiohttp.StreamReader(BaseProtocol(loop), 2**16, loop=loop)
        for piece in pieces:
            content.feed_data(piece)
        content.feed_eof()
        return [reading async for reading in _chunks(content, kind)]

    return asyncio.run(read())


def test_streams_are_read_line_by_line_however_the_bytes_fall():
    events = [b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\r\n\r\n',
              b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}]}\n\n',
              b'data: {"choices":[],"usage":{"completion_tokens":2}}\n\ndata: [DONE]\n\n', b'data: {"error": 1}\n\n']
    whole = b"".join(events)
    pieces = [whole[i : i + 7] for i in range(0, len(whole), 7)]
    readings = _read(pieces, "completion")
    assert [(r.has_token, r.finish_reason, r.usage_tokens) for r in readings] == [(True, None, None), (False, "length", None), (False, None, 2)]
    node = _read([b'{"token_ids":[1,2],"text":"ab","finish_reason":null}\n{"token_ids":[3],', b'"text":"c","finish_reason":"length"}'], "node")
    assert [(r.tokens, r.finish_reason) for r in node] == [(2, None), (1, "length")]
