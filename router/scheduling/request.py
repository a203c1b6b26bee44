"""The request as the scheduler sees it: its size in blocks and where its prefix is cached."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvferry.router.nodes import NodeView


@dataclass(frozen=True)
class SchedulingRequest:
    model: str
    num_prompt_tokens: int
    num_blocks: int  # full blocks of the prompt (the hashed ones)
    cached_blocks: dict[str, int] = field(default_factory=dict)  # node name -> leading blocks it holds
    decode: NodeView | None = None  # the chosen decode node, once picked (prefill scoring uses it)
