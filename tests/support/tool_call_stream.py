"""A streamed chat choice's tool calls, as a client puts them together from OpenAI's `delta.tool_calls`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def streamed_tool_calls(chunks: Iterable[Any]) -> tuple[list[tuple[str, str]], str | None]:
    """The (name, arguments) of each call, by index, and the choice's finish reason (one choice streamed)."""
    calls: dict[int, list[str]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, ["", ""])
                entry[0] += delta.function.name or ""
                entry[1] += delta.function.arguments or ""
    return [(calls[index][0], calls[index][1]) for index in sorted(calls)], finish
