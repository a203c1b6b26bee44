"""The prefix lookup, the first step of scheduling: where each node holds a prompt's leading blocks, from
the shared prefix index (one Redis round trip per prompt, off the event loop) joined with this router's
routing history. Its answer is what the prefix_hit and transfer_cost scorers read."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from kvferry.kvcache.block_hash import hash_prompt_blocks
from kvferry.kvcache.prefix_index import PrefixIndex
from kvferry.router.discovery.nodes import NodeView
from kvferry.router.scheduling.request import SchedulingRequest
from kvferry.router.scheduling.routing_history import RoutingHistory, combined

DEFAULT_BLOCK_SIZE = 16  # the nodes' default; their records say when they use another


class PrefixLookup:
    def __init__(self, model: str, index: PrefixIndex | None, history: RoutingHistory) -> None:
        self.model, self.index, self.history = model, index, history

    async def request_for(self, prompt_ids: list[int], nodes: Sequence[NodeView]) -> SchedulingRequest:
        block_size = next((node.block_size for node in nodes if node.block_size), DEFAULT_BLOCK_SIZE)
        hashes = hash_prompt_blocks(prompt_ids, block_size, model_salt=self.model)
        cached = await asyncio.to_thread(self.index.cached_prefix_blocks, hashes) if self.index and hashes else {}
        cached = combined(cached, self.history.cached_prefix_blocks(hashes))
        return SchedulingRequest(self.model, len(prompt_ids), len(hashes), cached, block_size=block_size,
                                 block_hashes=tuple(hashes))

    def routed(self, request: SchedulingRequest, node: str) -> None:
        """`node` computes the prompt's blocks now: later prompts sharing them find it before the index does."""
        self.history.record(request.block_hashes, node)
