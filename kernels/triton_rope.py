"""Neox-style rotary embedding in Triton: one program per token rotates all its q and k heads; the fused
variant the engine runs also writes the rotated k and the v to their KV-pool slots.

The [max_pos, 2, head_dim] float32 table (engine/rope.py) already holds any scaling (linear, Llama-3.1),
so the kernel only reads it. Both halves of cos and sin are read from the table rather than assuming they
repeat. As in reference.apply_rope (and transformers' `q * cos + rotate_half(q) * sin`), cos/sin are
rounded to the input dtype and each product is rounded before the sum. On an H200 about 1.5% of 16-bit
outputs still land one ulp away from torch's; the cause is not established.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvferry.kernels import pdl
from kvferry.kernels.pdl import wait_for_predecessor


@triton.jit
def _rotate_heads(
    x_ptr,
    out_ptr,
    token,
    stride_xt,
    stride_xh,
    stride_xd,
    stride_ot,
    stride_oh,
    num_heads,
    cos_lo,
    cos_hi,
    sin_lo,
    sin_hi,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < num_heads) & (dims < HALF)
    src = x_ptr + token * stride_xt + heads * stride_xh
    lo = tl.load(src + dims * stride_xd, mask=mask, other=0.0)
    hi = tl.load(src + (dims + HALF) * stride_xd, mask=mask, other=0.0)
    dtype = lo.dtype
    lo32, hi32 = lo.to(tl.float32), hi.to(tl.float32)
    # out = x * cos + cat(-hi, lo) * sin, every product rounded to the input dtype like torch's.
    new_lo = (lo32 * cos_lo).to(dtype).to(tl.float32) + (-hi32 * sin_lo).to(dtype).to(tl.float32)
    new_hi = (hi32 * cos_hi).to(dtype).to(tl.float32) + (lo32 * sin_hi).to(dtype).to(tl.float32)
    dst = out_ptr + token * stride_ot + heads * stride_oh
    tl.store(dst + dims, new_lo.to(dtype), mask=mask)
    tl.store(dst + dims + HALF, new_hi.to(dtype), mask=mask)


@triton.jit
def _cos_sin(cache_ptr, positions_ptr, token, stride_cache_pos, stride_cache_kind, dtype,
             HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):  # fmt: skip
    """The token's cos and sin halves, rounded to the input dtype as torch rounds them."""
    position = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, BLOCK_HALF)[None, :]
    dim_mask = dims < HALF
    cos_row = cache_ptr + position * stride_cache_pos
    sin_row = cos_row + stride_cache_kind
    cos_lo = tl.load(cos_row + dims, mask=dim_mask, other=0.0).to(dtype).to(tl.float32)
    cos_hi = tl.load(cos_row + dims + HALF, mask=dim_mask, other=0.0).to(dtype).to(tl.float32)
    sin_lo = tl.load(sin_row + dims, mask=dim_mask, other=0.0).to(dtype).to(tl.float32)
    sin_hi = tl.load(sin_row + dims + HALF, mask=dim_mask, other=0.0).to(dtype).to(tl.float32)
    return cos_lo, cos_hi, sin_lo, sin_hi


@triton.jit
def _rope_kernel(
    q_ptr,
    k_ptr,
    positions_ptr,
    cache_ptr,
    q_out_ptr,
    k_out_ptr,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_qot,
    stride_qoh,
    stride_kot,
    stride_koh,
    stride_cache_pos,
    stride_cache_kind,
    num_q_heads,
    num_k_heads,
    HALF: tl.constexpr,
    BLOCK_QH: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0)
    cos_lo, cos_hi, sin_lo, sin_hi = _cos_sin(cache_ptr, positions_ptr, token, stride_cache_pos, stride_cache_kind,
                                              q_ptr.dtype.element_ty, HALF, BLOCK_HALF)  # fmt: skip
    _rotate_heads(
        q_ptr, q_out_ptr, token, stride_qt, stride_qh, stride_qd, stride_qot, stride_qoh, num_q_heads,
        cos_lo, cos_hi, sin_lo, sin_hi, HALF, BLOCK_QH, BLOCK_HALF,
    )  # fmt: skip
    _rotate_heads(
        k_ptr, k_out_ptr, token, stride_kt, stride_kh, stride_kd, stride_kot, stride_koh, num_k_heads,
        cos_lo, cos_hi, sin_lo, sin_hi, HALF, BLOCK_KH, BLOCK_HALF,
    )  # fmt: skip


@triton.jit
def _rope_store_kv_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    positions_ptr,
    cache_ptr,
    slot_mapping_ptr,
    q_out_ptr,
    key_cache_ptr,
    value_cache_ptr,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_qot,
    stride_qoh,
    stride_cache_pos,
    stride_cache_kind,
    stride_kc_block,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_block,
    stride_vc_slot,
    stride_vc_head,
    num_q_heads,
    num_k_heads,
    head_dim,
    PAGE_SIZE: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_QH: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    """apply_rope and store_kv in one launch: the rotated key goes straight to its pool slot, never to
    a tensor of its own (one kernel a layer fewer, and k is read once)."""
    wait_for_predecessor(PDL)
    token = tl.program_id(0)
    cos_lo, cos_hi, sin_lo, sin_hi = _cos_sin(cache_ptr, positions_ptr, token, stride_cache_pos, stride_cache_kind,
                                              q_ptr.dtype.element_ty, HALF, BLOCK_HALF)  # fmt: skip
    _rotate_heads(
        q_ptr, q_out_ptr, token, stride_qt, stride_qh, stride_qd, stride_qot, stride_qoh, num_q_heads,
        cos_lo, cos_hi, sin_lo, sin_hi, HALF, BLOCK_QH, BLOCK_HALF,
    )  # fmt: skip
    # Block ids become int64 before they multiply the block stride (see triton_store_kv).
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    block, offset = slot // PAGE_SIZE, slot % PAGE_SIZE
    key_dst = key_cache_ptr + block * stride_kc_block + offset * stride_kc_slot
    _rotate_heads(
        k_ptr, key_dst, token, stride_kt, stride_kh, stride_kd, 0, stride_kc_head, num_k_heads,
        cos_lo, cos_hi, sin_lo, sin_hi, HALF, BLOCK_KH, BLOCK_HALF,
    )  # fmt: skip
    heads = tl.arange(0, BLOCK_KH)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < num_k_heads) & (dims < head_dim)
    value = tl.load(v_ptr + token * stride_vt + heads * stride_vh + dims * stride_vd, mask=mask)
    value_dst = value_cache_ptr + block * stride_vc_block + offset * stride_vc_slot
    tl.store(value_dst + heads * stride_vc_head + dims, value, mask=mask)


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_out: torch.Tensor | None = None,
    k_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [tokens, q_heads, head_dim] and k [tokens, k_heads, head_dim] (any strides) by each
    token's position; returns new contiguous tensors, or writes `q_out`/`k_out` (contiguous) when given."""
    tokens, num_q_heads, head_dim = q.shape
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if q_out is None else q_out
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device) if k_out is None else k_out
    if tokens == 0:
        return q_out, k_out
    half = head_dim // 2
    _rope_kernel[(tokens,)](
        q,
        k,
        positions,
        cos_sin_cache,
        q_out,
        k_out,
        *q.stride(),
        *k.stride(),
        q_out.stride(0),
        q_out.stride(1),
        k_out.stride(0),
        k_out.stride(1),
        cos_sin_cache.stride(0),
        cos_sin_cache.stride(1),
        num_q_heads,
        k.shape[1],
        HALF=half,
        BLOCK_QH=triton.next_power_of_2(num_q_heads),
        BLOCK_KH=triton.next_power_of_2(k.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(half),
    )
    return q_out, k_out


def apply_rope_and_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate q and k by each token's position, write the rotated k and v [tokens, kv_heads, head_dim] to
    their pool slots (caches [num_blocks, block_size, kv_heads, head_dim], head_dim contiguous) and
    return the rotated q (new and contiguous, or `q_out`)."""
    tokens, num_q_heads, head_dim = q.shape
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("the caches' head_dim must be contiguous")
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if q_out is None else q_out
    if tokens == 0:
        return q_out
    half, num_k_heads = head_dim // 2, k.shape[1]
    use_pdl = pdl.enabled(q)
    _rope_store_kv_kernel[(tokens,)](
        q,
        k,
        v,
        positions,
        cos_sin_cache,
        slot_mapping,
        q_out,
        key_cache,
        value_cache,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        q_out.stride(0),
        q_out.stride(1),
        cos_sin_cache.stride(0),
        cos_sin_cache.stride(1),
        *key_cache.stride()[:3],
        *value_cache.stride()[:3],
        num_q_heads,
        num_k_heads,
        head_dim,
        PAGE_SIZE=key_cache.shape[1],
        HALF=half,
        BLOCK_QH=triton.next_power_of_2(num_q_heads),
        BLOCK_KH=triton.next_power_of_2(num_k_heads),
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_D=triton.next_power_of_2(head_dim),
        PDL=use_pdl,
        launch_pdl=use_pdl,
    )
    return q_out
