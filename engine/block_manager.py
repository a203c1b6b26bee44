"""Gives sequences their KV blocks: prefix-cache hits at admission, new blocks as they grow."""

from __future__ import annotations

from kvferry.engine.sequence import Sequence
from kvferry.kvcache.allocator import BlockAllocator
from kvferry.kvcache.block_hash import ROOT_PARENT, hash_block_tokens


class BlockManager:
    def __init__(self, allocator: BlockAllocator, block_size: int, model_salt: str) -> None:
        self.allocator = allocator
        self.block_size = block_size
        self.model_salt = model_salt

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _extend_hashes(self, seq: Sequence, num_tokens: int) -> None:
        """Grow seq.block_hashes to cover the full blocks among its first `num_tokens` tokens."""
        size = self.block_size
        for block in range(len(seq.block_hashes), num_tokens // size):
            parent = seq.block_hashes[-1] if seq.block_hashes else ROOT_PARENT
            tokens = seq.token_ids[block * size : (block + 1) * size]
            seq.block_hashes.append(hash_block_tokens(parent, tokens, self.model_salt))

    def take_prefix_hits(self, seq: Sequence) -> None:
        """Start a sequence on the cached blocks of its longest cached prefix. The last token is always
        recomputed, since its logits are needed, so at most (num_tokens - 1) // block_size blocks hit."""
        reusable = (seq.num_tokens - 1) // self.block_size
        self._extend_hashes(seq, reusable * self.block_size)
        hits = self.allocator.longest_cached_prefix(seq.block_hashes[:reusable])
        self.allocator.take_cached(hits)
        seq.block_ids = list(hits)
        seq.num_computed_tokens = len(hits) * self.block_size

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for `num_new_tokens` more computed tokens; False (nothing taken) if blocks are short."""
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_ids)
        if needed > self.allocator.num_free_blocks:
            return False
        if needed > 0:
            # Ascending: the allocator's queue holds freed blocks last-first, so a prompt's blocks would
            # otherwise come out descending, and no two of them would move in one transfer message.
            seq.block_ids.extend(sorted(self.allocator.allocate(needed)))
        return True

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Offer every full block whose tokens are all computed to the prefix cache."""
        full = seq.num_computed_tokens // self.block_size
        self._extend_hashes(seq, full * self.block_size)
        for block in range(seq.num_registered_blocks, full):
            parent = seq.block_hashes[block - 1] if block else ROOT_PARENT
            self.allocator.cache_block(seq.block_ids[block], seq.block_hashes[block], parent)
        seq.num_registered_blocks = max(seq.num_registered_blocks, full)

    def free(self, seq: Sequence) -> None:
        self.allocator.free(seq.block_ids)
        seq.block_ids = []
