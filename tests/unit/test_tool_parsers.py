"""Tool-call parsers (router/api/tool_parsers.py): the same calls and content however the text is cut into
pieces, what is not a call stays the model's text, and forced calls stream as they close."""

from __future__ import annotations

import json

import pytest

from kvferry.router.api.parsed_output import Parsed
from kvferry.router.api.tool_parsers import (
    HermesParser,
    Llama3JsonParser,
    NamedParser,
    RequiredParser,
    ToolCallParser,
)

HERMES = ('Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris <3"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "time", "arguments": {"zone": "CET"}}\n</tool_call>')


def fed(parser: ToolCallParser, text: str, piece: int) -> tuple[Parsed, list[Parsed]]:
    """Everything `parser` gave for `text` in pieces of `piece` characters, and each piece's own result."""
    total, each = Parsed(), []
    for start in range(0, len(text), piece):
        each.append(parser.feed(text[start:start + piece]))
        total += each[-1]
    each.append(parser.finish())
    total += each[-1]
    return total, each


def calls(parsed: Parsed) -> list[tuple[str, dict]]:
    return [(delta["function"]["name"], json.loads(delta["function"]["arguments"])) for delta in parsed.deltas]


@pytest.mark.parametrize("piece", [1, 3, 7, 1000])
def test_hermes_calls_and_text_are_the_same_however_the_text_is_cut(piece):
    parser = HermesParser()
    total, _ = fed(parser, HERMES, piece)
    assert calls(total) == [("weather", {"city": "Paris <3"}), ("time", {"zone": "CET"})]
    assert total.content == "Let me look.\n\n" and [d["index"] for d in total.deltas] == [0, 1]
    assert parser.finish_reason("stop") == "tool_calls" and parser.finish_reason("length") == "length"
    assert len({call.id for call in parser.calls}) == 2


def test_hermes_holds_back_only_what_could_start_a_tag():
    parser = HermesParser()
    assert parser.feed("a <b> <tool").content == "a <b> "
    assert parser.feed("s are fun").content == "<tools are fun"
    assert parser.finish().content == "" and parser.finish_reason("stop") == "stop"


def test_hermes_text_that_is_not_a_call_stays_text():
    parser = HermesParser()
    total, _ = fed(parser, "x <tool_call>not json</tool_call> y <tool_call>{\"name\": \"open", 4)
    assert total.content == "x <tool_call>not json</tool_call> y <tool_call>{\"name\": \"open" and not total.deltas


@pytest.mark.parametrize("piece", [1, 5, 1000])
def test_llama3_json_answers_are_calls_and_other_answers_stream_as_text(piece):
    parser = Llama3JsonParser()
    total, _ = fed(parser, '{"name": "weather", "parameters": {"city": "a;b"}}; {"name": "time", "parameters": {}}', piece)
    assert calls(total) == [("weather", {"city": "a;b"}), ("time", {})] and total.content == ""
    text = Llama3JsonParser()
    total, each = fed(text, "The answer is 4 {not a call}", piece)
    assert total.content == "The answer is 4 {not a call}" and not total.deltas
    assert each[0].content  # streamed at once, not held to the end
    wrong = Llama3JsonParser()
    total, _ = fed(wrong, '{"answer": 4}', piece)
    assert total.content == '{"answer": 4}' and not total.deltas and wrong.finish_reason("stop") == "stop"


def test_required_calls_are_sent_as_each_object_closes():
    parser = RequiredParser()
    text = '[{"name": "a", "parameters": {"s": "}]\\"{", "n": [1, {"x": 2}]}}, {"name": "b", "parameters": {}}]'
    total, each = fed(parser, text, 1)
    assert calls(total) == [("a", {"s": '}]"{', "n": [1, {"x": 2}]}), ("b", {})]
    first_closed = text.index("}}, ") + 1  # the piece that ends the first object brings its call
    assert each[first_closed].deltas and not any(piece.deltas for piece in each[:first_closed])
    assert parser.finish_reason("stop") == "tool_calls"


def test_a_named_call_streams_its_arguments_and_ends_as_stop():
    parser = NamedParser("weather")
    total, each = fed(parser, '{"city": "Oslo"}', 4)
    assert each[0].deltas[0]["function"] == {"name": "weather", "arguments": '{"ci'} and "id" in each[0].deltas[0]
    assert "".join(d["function"]["arguments"] for d in total.deltas) == '{"city": "Oslo"}'
    assert [(c.name, c.arguments) for c in parser.calls] == [("weather", '{"city": "Oslo"}')]
    assert parser.finish_reason("stop") == "stop"
