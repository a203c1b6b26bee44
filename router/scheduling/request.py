"""The request as the scheduler sees it: its size in blocks and where its prefix is cached."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvferry.router.discovery.nodes import NodeView


@dataclass(frozen=True)
class SchedulingRequest:
    model: str
    num_prompt_tokens: int
    num_blocks: int  # full blocks of the prompt (the hashed ones)
    cached_blocks: dict[str, int] = field(default_factory=dict)  # node name -> leading blocks it holds
    decode: NodeView | None = None  # the chosen decode node, once picked (prefill scoring uses it)
    block_size: int = 16
    block_hashes: tuple[int, ...] = ()  # the prompt's chained block hashes (the routing history keeps them)
    session_nodes: frozenset[str] = frozenset()  # the nodes of its conversation's last turn (sessions.py)

    def uncached_tokens(self, nodes: list[NodeView]) -> int:
        """The prompt tokens the best-placed of `nodes` would still compute."""
        held = max((self.cached_blocks.get(node.name, 0) for node in nodes), default=0)
        return max(0, self.num_prompt_tokens - held * self.block_size)
