"""Chained prefix-block hashing, the one function the router and the nodes share (DESIGN.md §3).

h_i = H(h_{i-1}, model_salt, tokens of block i), over full blocks only. xxh3 with a fixed seed keeps
hashes equal across processes and machines, unlike Python's randomized `hash`. The tokens are hashed as
native int64 bytes through the standard library's `array` (the same bytes numpy gave): the router imports
this module, and numpy would be ~0.17 s of its start-up for this one conversion.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import xxhash

HASH_SEED = 0x6B766665  # "kvfe": fixed so every process computes the same chain
ROOT_PARENT = 0


def hash_block_tokens(parent_hash: int, block_tokens: Sequence[int], model_salt: str = "") -> int:
    """Hash one full block given the hash of the block before it (ROOT_PARENT for the first block)."""
    hasher = xxhash.xxh3_64(seed=HASH_SEED)
    hasher.update(parent_hash.to_bytes(8, "little"))
    hasher.update(model_salt.encode())
    hasher.update(array("q", block_tokens).tobytes())
    return hasher.intdigest()


def hash_prompt_blocks(token_ids: Sequence[int], block_size: int, model_salt: str = "") -> list[int]:
    """Hashes of every full block of `token_ids`, in order; a partial last block gets no hash."""
    hashes: list[int] = []
    parent = ROOT_PARENT
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start : start + block_size], model_salt)
        hashes.append(parent)
    return hashes
