"""Paged KV cache: pool layout, block allocator with prefix cache, chained block hashing, KV events."""

from kvferry.kvcache.allocator import NULL_BLOCK_ID, AllocatorStats, BlockAllocator, OutOfBlocksError
from kvferry.kvcache.block_hash import hash_block_tokens, hash_prompt_blocks
from kvferry.kvcache.events import BlockRemoved, BlockStored, KVEvent
from kvferry.kvcache.kv_pool import KVPool, KVPoolLayout

__all__ = [
    "NULL_BLOCK_ID",
    "AllocatorStats",
    "BlockAllocator",
    "BlockRemoved",
    "BlockStored",
    "KVEvent",
    "KVPool",
    "KVPoolLayout",
    "OutOfBlocksError",
    "hash_block_tokens",
    "hash_prompt_blocks",
]
