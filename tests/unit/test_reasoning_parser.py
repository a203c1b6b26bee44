"""The reasoning split (router/api/reasoning.py, router/api/output_parser.py): the same thinking and answer
however the output is cut into pieces, a thinking the prompt opened, none at all, an unclosed one, and tool
calls after the thinking."""

from __future__ import annotations

import json

import pytest

from kvferry.router.api.openai_schema import ChatCompletionRequest
from kvferry.router.api.output_parser import ChoiceSplit, OutputParser
from kvferry.router.api.parsed_output import Parsed
from kvferry.router.api.reasoning import ReasoningParser, template_thinks, thinking_open
from kvferry.router.api.tool_calls import ToolUse

PIECES = [1, 2, 5, 1000]


def split(text: str, piece: int, *, inside: bool = False, parser: OutputParser | None = None) -> tuple[Parsed, OutputParser]:
    """Everything the parser gave for `text` fed in pieces of `piece` characters."""
    parser = parser or OutputParser(ReasoningParser(inside=inside), None)
    total = Parsed()
    for start in range(0, len(text), piece):
        total += parser.feed(text[start:start + piece])
    total += parser.finish()
    return total, parser


@pytest.mark.parametrize("piece", PIECES)
def test_a_thinking_block_the_model_opens_goes_apart_from_the_answer(piece):
    total, parser = split("<think>\nThe user greets me. </thin> is no tag.\n</think>\n\nHello there!", piece)
    assert total.reasoning == "The user greets me. </thin> is no tag." and total.content == "Hello there!"
    assert parser.reasoning_content(total.reasoning) == total.reasoning


@pytest.mark.parametrize("piece", PIECES)
def test_a_thinking_block_the_prompt_opened_ends_at_its_close(piece):
    total, _ = split("\nFirst, 2 + 2.\nThat is 4.\n</think>\n\nIt is 4. A later </think> is text.", piece, inside=True)
    assert total.reasoning == "First, 2 + 2.\nThat is 4." and total.content == "It is 4. A later </think> is text."


@pytest.mark.parametrize("piece", PIECES)
def test_an_answer_without_thinking_is_all_content(piece):
    total, parser = split("  Hello <think> is only text here", piece)
    assert total.content == "  Hello <think> is only text here" and total.reasoning == ""
    assert parser.reasoning_content(total.reasoning) is None  # no thinking: null, not ""


def test_an_empty_thinking_block_is_empty_reasoning_and_an_unclosed_one_is_all_reasoning():
    empty, parser = split("<think>\n\n</think>\n\nHi", 3)
    assert (empty.reasoning, empty.content, parser.reasoning_content(empty.reasoning)) == ("", "Hi", "")
    unclosed, _ = split("<think>\nStill thinking about it\n</thi", 4)
    assert (unclosed.reasoning, unclosed.content) == ("Still thinking about it\n</thi", "")


def test_what_could_start_a_tag_is_held_back_until_the_next_piece_says():
    parser = ReasoningParser(inside=False)
    assert parser.feed(" <thi") == ("", "")
    assert parser.feed("nk>a  ") == ("a", "")  # the whitespace may be the close tag's
    assert parser.feed(" b </") == ("   b", "")
    assert parser.feed("think> c") == ("", "c")


def test_tool_calls_after_the_thinking_are_found_in_the_answer():
    body = ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "weather?"}],
        "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]})
    choice_split = ChoiceSplit(ToolUse.of(body, "hermes"), thinking_open=False)
    text = ('<think>I need the weather.</think>\n\nLet me check.<tool_call>{"name": "weather", "arguments": '
            '{"city": "Oslo"}}</tool_call>')
    for piece in PIECES:
        total, parser = split(text, piece, parser=choice_split.parser())
        assert total.reasoning == "I need the weather." and total.content == "Let me check."
        assert [(d["function"]["name"], json.loads(d["function"]["arguments"])) for d in total.deltas] == [
            ("weather", {"city": "Oslo"})]
        assert parser.finish_reason("stop") == "tool_calls"


def test_where_the_output_starts_is_read_from_the_prompt_and_the_template():
    assert thinking_open("<|im_start|>assistant\n<think>\n")
    assert not thinking_open("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # enable_thinking: false
    assert not thinking_open("<|im_start|>assistant\n")
    assert template_thinks("{{ '<think>\\n' }}{{ content }}{{ '</think>' }}") and not template_thinks("{{ messages }}")
    assert not ChoiceSplit(None, None).splits and ChoiceSplit(None, False).splits
