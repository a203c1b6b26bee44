"""Where the router sent each prompt's blocks lately.

Nodes publish a block to the prefix index once they have computed it, so a prefix that a node is still
prefilling (queued behind others, or running) is not in the index yet. Without a memory of its own, every
request of a group that arrives while the group's first request waits looks like a miss, and is spread
over the nodes by load: each node then prefills and caches every group's prefix, and they evict each
other's. llm-d's approximate prefix scorer and SGLang's cache-aware router keep the same kind of routing
history. It only adds to the index (a node's score is the larger of the two) and forgets after a TTL, by
when the index has the blocks of any prefill that finished.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

DEFAULT_MAX_BLOCKS = 1 << 18  # block hashes remembered (a few MB), oldest forgotten first


class RoutingHistory:
    def __init__(self, ttl_seconds: float, max_blocks: int = DEFAULT_MAX_BLOCKS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_seconds, self.max_blocks, self.clock = ttl_seconds, max_blocks, clock
        self._sent: OrderedDict[int, dict[str, float]] = OrderedDict()  # block hash -> node -> expiry

    def record(self, hashes: Sequence[int], node: str) -> None:
        """`node` was sent a prompt with these leading block hashes."""
        if self.ttl_seconds <= 0:
            return
        expiry = self.clock() + self.ttl_seconds
        for block_hash in hashes:
            self._sent.setdefault(block_hash, {})[node] = expiry
            self._sent.move_to_end(block_hash)
        while len(self._sent) > self.max_blocks:
            self._sent.popitem(last=False)

    def cached_prefix_blocks(self, hashes: Sequence[int]) -> dict[str, int]:
        """Node -> how many leading blocks of `hashes` it was sent within the TTL (nodes with none left out)."""
        now = self.clock()
        leading: dict[str, int] = {}
        alive: set[str] | None = None
        for position, block_hash in enumerate(hashes):
            sent = {node for node, expiry in self._sent.get(block_hash, {}).items() if expiry > now}
            alive = sent if alive is None else alive & sent
            if not alive:
                break
            for node in alive:
                leading[node] = position + 1
        return leading


def combined(index: dict[str, int], history: dict[str, int]) -> dict[str, int]:
    """Per node, the longer of the prefix the index knows and the one the router sent it."""
    return {node: max(index.get(node, 0), history.get(node, 0)) for node in index.keys() | history.keys()}
