"""Block allocator with reference counts and a prefix cache (vLLM v1's free queue, simplified).

Every usable block is in exactly one state:
- in use: ref_count > 0, held by one or more sequences;
- cached: ref_count == 0 but still hashed, so a later prompt with the same prefix can reuse it;
- free: ref_count == 0 and unhashed.
Cached and free blocks share one LRU queue (an OrderedDict gives O(1) removal on a prefix hit).
Allocation pops the least recently freed block and evicts its hash lazily, only then. Sequences free
their blocks tail first, so the ends of chains are evicted before their shared prefixes.
Block 0 is the null block: never allocated, it pads block tables.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvferry.kvcache.events import BlockRemoved, BlockStored, KVEvent

NULL_BLOCK_ID = 0
# Events wait here until a node publishes them; an engine nobody drains (offline use) stops recording
# at this bound instead of growing without end, and a consumer that comes late resynchronises.
MAX_PENDING_EVENTS = 100_000


class OutOfBlocksError(RuntimeError):
    """Raised when an allocation asks for more blocks than are free or evictable."""


@dataclass
class BlockState:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None


@dataclass(frozen=True)
class AllocatorStats:
    total: int
    free: int
    cached: int
    in_use: int


class BlockAllocator:
    def __init__(self, num_blocks: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [BlockState(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(1, num_blocks))
        self.cached_block_by_hash: dict[int, int] = {}
        self.pending_events: list[KVEvent] = []
        self.events_lost = False

    # ---- allocation -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks that an allocation can take now: free ones plus cached ones it may evict."""
        return len(self.free_queue)

    def allocate(self, count: int) -> list[int]:
        if count > len(self.free_queue):
            raise OutOfBlocksError(f"need {count} blocks, {len(self.free_queue)} free")
        block_ids = []
        for _ in range(count):
            block_id, _ = self.free_queue.popitem(last=False)
            self._evict_hash(self.blocks[block_id])
            self.blocks[block_id].ref_count = 1
            block_ids.append(block_id)
        return block_ids

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference from each block; blocks reaching zero join the queue tail first."""
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise RuntimeError(f"block {block_id} freed more often than it was taken")
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue[block_id] = None

    # ---- prefix cache -----------------------------------------------------------------------
    def longest_cached_prefix(self, block_hashes: Iterable[int]) -> list[int]:
        """Block ids of the longest run of leading hashes that are cached, without taking them."""
        hits = []
        if not self.enable_prefix_caching:
            return hits
        for block_hash in block_hashes:
            block_id = self.cached_block_by_hash.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def take_cached(self, block_ids: Sequence[int]) -> None:
        """Add a reference to prefix-hit blocks, pulling idle ones out of the eviction queue."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_queue[block_id]
            block.ref_count += 1

    def cache_block(self, block_id: int, block_hash: int, parent_hash: int) -> None:
        """Record that a full, computed block holds the tokens behind `block_hash`."""
        if not self.enable_prefix_caching:
            return
        block = self.blocks[block_id]
        if block.block_hash is not None or block_hash in self.cached_block_by_hash:
            return  # an identical block is cached already; this copy stays private to its sequence
        block.block_hash = block_hash
        self.cached_block_by_hash[block_hash] = block_id
        self._record(BlockStored(block_hash, parent_hash))

    def _evict_hash(self, block: BlockState) -> None:
        if block.block_hash is None:
            return
        del self.cached_block_by_hash[block.block_hash]
        self._record(BlockRemoved(block.block_hash))
        block.block_hash = None

    def reset_prefix_cache(self) -> None:
        """Forget every idle cached block (in-use blocks keep their hashes)."""
        for block_id in self.free_queue:
            self._evict_hash(self.blocks[block_id])

    def _record(self, event: KVEvent) -> None:
        if len(self.pending_events) >= MAX_PENDING_EVENTS:
            self.events_lost = True
            return
        self.pending_events.append(event)

    def take_events(self) -> list[KVEvent] | None:
        """The events since the last call, or None when some were dropped at the bound: then the consumer
        resynchronises from cached_hashes()."""
        events, self.pending_events = self.pending_events, []
        lost, self.events_lost = self.events_lost, False
        return None if lost else events

    def cached_hashes(self) -> list[int]:
        """Every hash this pool holds a block for (in use or idle): the whole of what the index should say."""
        return list(self.cached_block_by_hash)

    # ---- checks -----------------------------------------------------------------------------
    def stats(self) -> AllocatorStats:
        cached = sum(1 for b in self.free_queue if self.blocks[b].block_hash is not None)
        in_use = sum(1 for b in self.blocks[1:] if b.ref_count > 0)
        return AllocatorStats(self.num_blocks - 1, len(self.free_queue) - cached, cached, in_use)

    def check_integrity(self) -> AllocatorStats:
        """Assert free + cached + in use == total and that the hash map and block states agree."""
        stats = self.stats()
        if stats.free + stats.cached + stats.in_use != stats.total:
            raise AssertionError(f"allocator leak: {stats}")
        for block_hash, block_id in self.cached_block_by_hash.items():
            if self.blocks[block_id].block_hash != block_hash:
                raise AssertionError(f"hash map points block {block_id} at a hash it does not hold")
        if self.blocks[NULL_BLOCK_ID].ref_count or NULL_BLOCK_ID in self.free_queue:
            raise AssertionError("the null block was handed out")
        return stats
