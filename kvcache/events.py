"""KV cache events a node publishes so the shared prefix index (Redis) can follow its cache."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockStored:
    """A full block with this hash became reusable on the node; `parent_hash` links the chain."""

    block_hash: int
    parent_hash: int


@dataclass(frozen=True)
class BlockRemoved:
    """The node evicted the block with this hash; it is no longer a prefix hit there."""

    block_hash: int


KVEvent = BlockStored | BlockRemoved
