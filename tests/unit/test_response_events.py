"""A streamed response's events (router/responses/stream.py): thinking, text and a call each become an output
item, added, filled by deltas and done, in order, numbered without gaps; the final response holds the items
the events named, and an answer that is only whitespace and a call has no message."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kvferry.router.admission.plugins import PluginChain, PluginContext
from kvferry.router.api.completion_shapes import TokenUsage
from kvferry.router.api.output_parser import OutputParser
from kvferry.router.api.reasoning import ReasoningParser
from kvferry.router.api.tool_parsers import HermesParser
from kvferry.router.responses.output import ResponseDraft
from kvferry.router.responses.schema import ResponsesRequest
from kvferry.router.responses.stream import ResponseEventWriter

DRAFT = ResponseDraft("resp_1", 1764720000, "tiny", ResponsesRequest(model="tiny", input="Weather?"))
CALL = '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'


def streamed(output: str, piece: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The events of `output` fed `piece` characters per chunk, and the response the writer finished with."""
    finished: dict[str, Any] = {}

    async def finish(items, text, reasoning, calls, finish_reason, usage):  # noqa: ANN001, ANN202 - the Finish type
        finished.update(items=items, text=text, reasoning=reasoning, calls=calls)
        return DRAFT.body("completed", items, usage)

    writer = ResponseEventWriter(DRAFT, OutputParser(ReasoningParser(inside=False), HermesParser()), PluginChain([]),
                                 PluginContext("chat", "tiny"), finish)
    raw = writer.opening()
    pieces = [output[start:start + piece] for start in range(0, len(output), piece)]
    for number, text in enumerate(pieces):
        last = number == len(pieces) - 1
        raw += writer.batch(0, [{"text": text, "token_ids": [1], "finish_reason": "stop" if last else None}])
    raw += asyncio.run(writer.closing(TokenUsage(5, len(pieces), 0)))
    events = []
    for block in raw.decode().strip().split("\n\n"):
        kind, data = block.split("\n")
        events.append(json.loads(data.removeprefix("data: ")))
        assert kind == f"event: {events[-1]['type']}"
    return events, finished


@pytest.mark.parametrize("piece", [1, 4, 1000])
def test_thinking_text_and_a_call_are_three_items_in_order(piece):
    events, finished = streamed(f"<think>Check the sky.</think>\n\nLet me look. {CALL}", piece)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    added = [(event["output_index"], event["item"]["type"]) for event in events if event["type"] == "response.output_item.added"]
    assert added == [(0, "reasoning"), (1, "message"), (2, "function_call")]
    thinking = "".join(event["delta"] for event in events if event["type"] == "response.reasoning_text.delta")
    text = "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")
    assert (thinking, text) == ("Check the sky.", "Let me look. ")
    done = [event["item"] for event in events if event["type"] == "response.output_item.done"]
    assert done == finished["items"] == events[-1]["response"]["output"] and events[-1]["type"] == "response.completed"
    assert done[2]["name"] == "weather" and json.loads(done[2]["arguments"]) == {"city": "Oslo"}
    assert done[0]["content"][0]["text"] == "Check the sky." and done[1]["content"][0]["text"] == "Let me look. "


def test_an_answer_of_whitespace_and_a_call_has_no_message_and_an_empty_one_has_one():
    events, finished = streamed(f"\n\n{CALL}", 3)
    assert [item["type"] for item in finished["items"]] == ["function_call"]
    assert not any(event["type"] == "response.output_text.delta" for event in events)
    _, empty = streamed(" ", 1)
    assert [(item["type"], item["content"][0]["text"]) for item in empty["items"]] == [("message", " ")]
