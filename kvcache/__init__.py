"""Paged KV cache: pool layout, block allocator with prefix cache, chained block hashing, KV events, and
where the cache's nodes are found (the node registry).

The names load on first use (PEP 562): the router imports the block hash and the prefix index from here,
and must not import torch with them (the pool's module does).
"""

from __future__ import annotations

from kvferry.lazy_names import lazy_names

_HOMES = {
    "NULL_BLOCK_ID": "kvferry.kvcache.allocator",
    "AllocatorStats": "kvferry.kvcache.allocator",
    "BlockAllocator": "kvferry.kvcache.allocator",
    "OutOfBlocksError": "kvferry.kvcache.allocator",
    "hash_block_tokens": "kvferry.kvcache.block_hash",
    "hash_prompt_blocks": "kvferry.kvcache.block_hash",
    "BlockRemoved": "kvferry.kvcache.events",
    "BlockStored": "kvferry.kvcache.events",
    "KVEvent": "kvferry.kvcache.events",
    "KVPool": "kvferry.kvcache.kv_pool",
    "KVPoolLayout": "kvferry.kvcache.kv_pool",
    "InMemoryRegistry": "kvferry.kvcache.node_registry",
    "PeerRegistry": "kvferry.kvcache.node_registry",
    "RedisRegistry": "kvferry.kvcache.node_registry",
}

__all__ = sorted(_HOMES)

__getattr__ = lazy_names(__name__, _HOMES)
