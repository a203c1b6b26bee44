"""Each chat choice's output split as it streams: the thinking first (router/api/reasoning.py), then, in the
answer, the tool calls (router/api/tool_parsers.py). One parser per choice, fed its text as it comes."""

from __future__ import annotations

from dataclasses import dataclass

from kvferry.router.api.parsed_output import Parsed
from kvferry.router.api.reasoning import ReasoningParser
from kvferry.router.api.tool_calls import ToolUse
from kvferry.router.api.tool_parsers import ToolCallFormat, ToolCallOut, ToolCallParser


@dataclass(frozen=True)
class OutputForm:
    """How the served model writes what is split out of its answers: from its chat template, or the router's
    settings (tool_call_parser, reasoning_parser)."""

    tool_calls: ToolCallFormat
    thinks: bool  # `<think>` blocks: the reasoning goes apart from the answer


@dataclass(frozen=True)
class ChoiceSplit:
    """One chat request's: what each of its choices' output is split into."""

    tool_use: ToolUse | None
    thinking_open: bool | None  # None: no reasoning split; True: the prompt opened the thinking

    @property
    def splits(self) -> bool:
        """Whether there is anything to split: without, the text goes on as it is."""
        return self.tool_use is not None or self.thinking_open is not None

    def parser(self) -> OutputParser:
        """A new choice's parser."""
        return OutputParser(None if self.thinking_open is None else ReasoningParser(inside=self.thinking_open),
                            None if self.tool_use is None else self.tool_use.parser())


class OutputParser:
    def __init__(self, reasoning: ReasoningParser | None, tools: ToolCallParser | None) -> None:
        self.reasoning, self.tools = reasoning, tools

    def feed(self, text: str) -> Parsed:
        thought, text = self.reasoning.feed(text) if self.reasoning else ("", text)
        return self._answer(thought, text, end=False)

    def finish(self) -> Parsed:
        """The end of the output: what either parser held back."""
        thought, text = self.reasoning.finish() if self.reasoning else ("", "")
        return self._answer(thought, text, end=True)

    def _answer(self, thought: str, text: str, end: bool) -> Parsed:
        if self.tools is None:
            return Parsed(content=text, reasoning=thought)
        parsed = self.tools.feed(text)
        if end:
            parsed += self.tools.finish()
        parsed.reasoning = thought
        return parsed

    @property
    def calls(self) -> list[ToolCallOut]:
        return self.tools.calls if self.tools else []

    def finish_reason(self, reason: str | None) -> str | None:
        return self.tools.finish_reason(reason) if self.tools else reason

    def reasoning_content(self, reasoning: str) -> str | None:
        """A whole choice's `reasoning_content`: None when the model did not think (or nothing splits it)."""
        return reasoning if self.reasoning is not None and self.reasoning.thought else None
