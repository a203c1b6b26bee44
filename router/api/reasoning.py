"""A thinking model's output split into its reasoning and its answer, as it streams: `<think>...</think>` (Qwen3's,
DeepSeek R1's) becomes `reasoning_content`, the rest `content`.

The thinking may start in the prompt: some templates end the generation prompt with `<think>` (Qwen3's thinking
models, DeepSeek R1), so the output begins inside the reasoning and only closes it. Others leave the model to
open it, or to skip it; with thinking turned off (`enable_thinking: false`) they write an empty, closed block
into the prompt and the output is all answer. The whitespace around the tags is the tags' own, left out of both.
"""

from __future__ import annotations

from typing import Literal

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_State = Literal["start", "opened", "reasoning", "after_close", "content"]


def thinking_open(prompt: str) -> bool:
    """Whether the prompt leaves a `<think>` open: its output starts inside the reasoning."""
    opened = prompt.rfind(THINK_OPEN)
    return opened >= 0 and prompt.find(THINK_CLOSE, opened) < 0


def template_thinks(template: str | None) -> bool:
    """Whether a chat template writes thinking blocks (Qwen3's, DeepSeek R1's)."""
    return template is not None and THINK_CLOSE in template


class ReasoningParser:
    """Fed the output as it comes, gives (reasoning, content) pieces. Whatever could still be the start of a
    tag, or whitespace that a tag would swallow, is held back until the next piece says."""

    def __init__(self, *, inside: bool) -> None:
        self.state: _State = "opened" if inside else "start"
        self.pending = ""
        self.thought = inside  # the output has a thinking block (perhaps an empty one)

    def feed(self, text: str) -> tuple[str, str]:
        self.pending += text
        reasoning = content = ""
        while True:
            if self.state == "start":  # before any text: does the model open a thinking block?
                head = self.pending.lstrip()
                if head.startswith(THINK_OPEN):
                    self.pending, self.state, self.thought = head[len(THINK_OPEN):], "opened", True
                elif THINK_OPEN.startswith(head):  # empty, or a tag's first characters
                    return reasoning, content
                else:
                    self.state = "content"
            elif self.state in ("opened", "after_close"):  # the whitespace after a tag is the tag's
                self.pending = self.pending.lstrip()
                if not self.pending:
                    return reasoning, content
                self.state = "reasoning" if self.state == "opened" else "content"
            elif self.state == "reasoning":
                end = self.pending.find(THINK_CLOSE)
                if end >= 0:
                    reasoning += self.pending[:end].rstrip()
                    self.pending, self.state = self.pending[end + len(THINK_CLOSE):], "after_close"
                    continue
                keep = _held_back(self.pending, THINK_CLOSE)
                reasoning += self.pending[:len(self.pending) - keep]
                self.pending = self.pending[len(self.pending) - keep:]
                return reasoning, content
            else:
                content += self.pending
                self.pending = ""
                return reasoning, content

    def finish(self) -> tuple[str, str]:
        """The end of the output: what was held back (an unclosed thinking is all reasoning)."""
        rest, self.pending = self.pending, ""
        if self.state == "reasoning":
            return rest.rstrip(), ""
        return "", rest if self.state in ("start", "content") else ""


def _held_back(text: str, tag: str) -> int:
    """How many of text's last characters to hold: a possible start of `tag`, and the whitespace before it
    (the tag's, if it comes)."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length + len(text[:-length]) - len(text[:-length].rstrip())
    return len(text) - len(text.rstrip())
