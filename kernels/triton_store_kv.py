"""Writes each new token's K and V into its pool slot, in Triton: one program per token.

The caches are the pool's strided per-layer views [num_blocks, block_size, kv_heads, head_dim]; the block
id times the block stride is computed in int64, since a pool's offsets pass 2**31 elements long before its
block ids pass 65535 (an 8B model's block spans 2**20 elements across its layers).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_kc_dim,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    stride_vc_dim,
    num_heads,
    head_dim,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_heads) & (dims < head_dim)
    key = tl.load(key_ptr + token * stride_kt + heads * stride_kh + dims * stride_kd, mask=mask)
    value = tl.load(value_ptr + token * stride_vt + heads * stride_vh + dims * stride_vd, mask=mask)
    key_dst = key_cache_ptr + block * stride_kc_block + offset * stride_kc_slot
    value_dst = value_cache_ptr + block * stride_vc_block + offset * stride_vc_slot
    tl.store(key_dst + heads * stride_kc_head + dims * stride_kc_dim, key, mask=mask)
    tl.store(value_dst + heads * stride_vc_head + dims * stride_vc_dim, value, mask=mask)


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [tokens, kv_heads, head_dim] to slot `block * block_size + offset` of the caches."""
    tokens, num_heads, head_dim = key.shape
    if tokens == 0:
        return
    _store_kv_kernel[(tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        *key.stride(),
        *value.stride(),
        *key_cache.stride(),
        *value_cache.stride(),
        num_heads,
        head_dim,
        BLOCK_SIZE=key_cache.shape[1],
        BLOCK_H=triton.next_power_of_2(num_heads),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )
