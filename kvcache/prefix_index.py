"""The shared prefix-cache index: which node holds which chained block hash (DESIGN.md §3).

Nodes apply their BlockStored / BlockRemoved events; the router asks, for one prompt's chain of block
hashes, how many leading blocks each node holds, in one round trip. The index is a hint: an entry that
is stale, evicted or missing costs a cache miss, never a wrong answer, and a Redis that is down makes
lookups return nothing (routing without the index) instead of failing requests.

Redis keys, per served model:
- `kvf:{model}:blk:{hash}` -> set of node names holding the block;
- `kvf:{model}:node-blocks:{node}` -> set of the hashes that node holds, so that a node's entries can be
  dropped at once (it restarted, or it resynchronises after Redis came back).
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Protocol

from kvferry.kvcache.events import BlockRemoved, BlockStored, KVEvent

log = logging.getLogger(__name__)


class PrefixIndex(Protocol):
    def apply(self, node: str, events: Sequence[KVEvent]) -> None:
        """Record a node's cache events, in order. Raises when the store cannot be reached."""
        ...

    def replace_node(self, node: str, block_hashes: Sequence[int]) -> None:
        """Make the index hold exactly these hashes for `node` (start-up, or resync after an outage)."""
        ...

    def cached_prefix_blocks(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """For a prompt's chain of block hashes: node -> how many leading blocks it holds (nodes with
        none are left out). Never raises: an unreachable store gives {}."""
        ...


def leading_runs(holders: Sequence[set[str]]) -> dict[str, int]:
    """holders[i] = nodes holding block i -> node -> length of its unbroken run from block 0."""
    runs: dict[str, int] = {}
    alive = set(holders[0]) if holders else set()
    for depth, nodes in enumerate(holders):
        alive &= nodes
        if not alive:
            break
        for node in alive:
            runs[node] = depth + 1
    return runs


class InMemoryPrefixIndex:
    """The index inside one process: `kvferry up` without Redis, and tests of routing."""

    def __init__(self) -> None:
        self._holders: dict[int, set[str]] = defaultdict(set)
        self._by_node: dict[str, set[int]] = defaultdict(set)
        self._lock = threading.Lock()

    def apply(self, node: str, events: Sequence[KVEvent]) -> None:
        with self._lock:
            for event in events:
                if isinstance(event, BlockStored):
                    self._holders[event.block_hash].add(node)
                    self._by_node[node].add(event.block_hash)
                elif isinstance(event, BlockRemoved):
                    self._holders[event.block_hash].discard(node)
                    self._by_node[node].discard(event.block_hash)

    def replace_node(self, node: str, block_hashes: Sequence[int]) -> None:
        with self._lock:
            for block_hash in self._by_node.pop(node, set()):
                self._holders[block_hash].discard(node)
            for block_hash in block_hashes:
                self._holders[block_hash].add(node)
                self._by_node[node].add(block_hash)

    def cached_prefix_blocks(self, block_hashes: Sequence[int]) -> dict[str, int]:
        with self._lock:
            return leading_runs([set(self._holders.get(h, ())) for h in block_hashes])


class RedisPrefixIndex:
    def __init__(self, url: str, model: str, socket_timeout: float = 0.25) -> None:
        import redis

        # A short timeout bounds what a Redis outage adds to a request's latency.
        self._redis = redis.Redis.from_url(url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout)
        self.model = model

    def _block_key(self, block_hash: int) -> str:
        return f"kvf:{self.model}:blk:{block_hash}"

    def _node_key(self, node: str) -> str:
        return f"kvf:{self.model}:node-blocks:{node}"

    def apply(self, node: str, events: Sequence[KVEvent]) -> None:
        if not events:
            return
        pipe = self._redis.pipeline(transaction=False)
        for event in events:
            if isinstance(event, BlockStored):
                pipe.sadd(self._block_key(event.block_hash), node)
                pipe.sadd(self._node_key(node), event.block_hash)
            elif isinstance(event, BlockRemoved):
                pipe.srem(self._block_key(event.block_hash), node)
                pipe.srem(self._node_key(node), event.block_hash)
        pipe.execute()

    def replace_node(self, node: str, block_hashes: Sequence[int]) -> None:
        old = {int(raw) for raw in self._redis.smembers(self._node_key(node))}
        new = set(block_hashes)
        pipe = self._redis.pipeline(transaction=False)
        for block_hash in old - new:
            pipe.srem(self._block_key(block_hash), node)
        for block_hash in new - old:
            pipe.sadd(self._block_key(block_hash), node)
        pipe.delete(self._node_key(node))
        if new:
            pipe.sadd(self._node_key(node), *new)
        pipe.execute()

    def cached_prefix_blocks(self, block_hashes: Sequence[int]) -> dict[str, int]:
        if not block_hashes:
            return {}
        pipe = self._redis.pipeline(transaction=False)
        for block_hash in block_hashes:
            pipe.smembers(self._block_key(block_hash))
        try:
            members = pipe.execute()
        except Exception as exc:  # noqa: BLE001 - the index is a hint: no answer means no hit
            log.warning("prefix index lookup failed, routing without it: %s", exc)
            return {}
        return leading_runs([{raw.decode() for raw in found} for found in members])


def prefix_index_from(url: str | None, model: str) -> PrefixIndex:
    """`redis://...` selects Redis; no URL an index inside this process."""
    if url is None:
        return InMemoryPrefixIndex()
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisPrefixIndex(url, model)
    raise ValueError(f"the prefix index needs a redis:// URL or none (in-process), got {url!r}")
