"""What a piece of a chat choice's output gave once split (router/api/output_parser.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Parsed:
    """Content to pass on, reasoning (`reasoning_content`), and tool-call deltas (OpenAI's `delta.tool_calls`)."""

    content: str = ""
    deltas: list[dict[str, Any]] = field(default_factory=list)
    reasoning: str = ""

    def __iadd__(self, other: Parsed) -> Parsed:
        self.content += other.content
        self.deltas += other.deltas
        self.reasoning += other.reasoning
        return self
