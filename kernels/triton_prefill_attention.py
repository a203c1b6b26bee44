"""Prefill / extend attention in Triton over a varlen batch whose K/V (cached prefix and new tokens) is
already in the paged pool.

A sequence with `n` new tokens and context length `c` has its new tokens at positions c - n .. c - 1;
each attends to every key at or before its own position. One program takes BLOCK_M new tokens of one
sequence for one query head. The grid holds `total_tokens // BLOCK_M + num_seqs` tiles, a bound on the
sum of every sequence's tile count, and each program finds its sequence by binary search over the query
offsets, so nothing is copied to the host to size the launch. Key tiles that every row of the tile sees
in full run without the causal mask; only the tiles on the diagonal pay for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvferry.kernels.triton_attention_common import (
    LOG2_E,
    dot_precision,
    load_paged_tile,
    online_softmax_step,
)


@dataclass(frozen=True)
class PrefillTiling:
    block_m: int  # new tokens per program
    block_n: int  # keys per tile
    num_warps: int
    num_stages: int


def default_tiling(dtype: torch.dtype) -> PrefillTiling:
    # Float32 tiles are twice the bytes: smaller ones keep the pipeline's buffers in shared memory.
    if dtype == torch.float32:
        return PrefillTiling(block_m=64, block_n=32, num_warps=4, num_stages=2)
    # The fastest of benchmarks/kernels.py --tune on an H200 (bf16, 4 x 4096 causal): 350 TFLOP/s against
    # 308 for (128, 64, 8 warps, 3 stages); two stages of 128-key tiles fit in shared memory at head dim 128.
    return PrefillTiling(block_m=128, block_n=128, num_warps=8, num_stages=2)


@triton.jit
def _find_sequence(query_start_loc_ptr, num_seqs, tile, BLOCK_M: tl.constexpr):
    """The last sequence whose first tile index (its start // BLOCK_M + its index) is at most `tile`."""
    lo: tl.int32 = 0
    hi: tl.int32 = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid).to(tl.int32) // BLOCK_M + mid
        if first_tile <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attend_key_range(
    acc,
    running_max,
    running_sum,
    q,
    row_positions,
    key_cache_ptr,
    value_cache_ptr,
    table_row,
    stride_tp,
    kv_head,
    dims,
    dim_mask,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    scale_log2,
    key_start,
    key_end,
    CAUSAL: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    for tile in range(key_start, key_end, BLOCK_N):
        keys = tile + tl.arange(0, BLOCK_N)
        valid = keys < key_end
        k = load_paged_tile(key_cache_ptr, table_row, stride_tp, keys, valid, kv_head, dims, dim_mask,
                            stride_kb, stride_ks, stride_kh, stride_kd, PAGE_SIZE)  # fmt: skip
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        if CAUSAL:
            scores = tl.where((keys[None, :] <= row_positions[:, None]) & valid[None, :], scores, float("-inf"))
        v = load_paged_tile(value_cache_ptr, table_row, stride_tp, keys, valid, kv_head, dims, dim_mask,
                            stride_vb, stride_vs, stride_vh, stride_vd, PAGE_SIZE)  # fmt: skip
        acc, running_max, running_sum = online_softmax_step(acc, running_max, running_sum, scores, v, PRECISION)
    return acc, running_max, running_sum


@triton.jit
def _prefill_kernel(
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    query_start_loc_ptr,
    out_ptr,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_tb,
    stride_tp,
    stride_ot,
    stride_oh,
    stride_od,
    scale_log2,
    num_seqs,
    group,
    head_dim,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # Heads are the fast grid axis, so the query heads sharing a kv head read its K/V at about one time.
    # Tiles run last to first: a sequence's later tiles see more keys, and starting with them leaves
    # the short ones for the last wave.
    head, tile = tl.program_id(0), tl.num_programs(1) - 1 - tl.program_id(1)
    seq = _find_sequence(query_start_loc_ptr, num_seqs, tile, BLOCK_M)
    q_begin = tl.load(query_start_loc_ptr + seq).to(tl.int32)
    num_new = tl.load(query_start_loc_ptr + seq + 1).to(tl.int32) - q_begin
    m_start = (tile - (q_begin // BLOCK_M + seq)) * BLOCK_M
    if m_start >= num_new:
        return
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    first_position = context_len - num_new + m_start
    rows = m_start + tl.arange(0, BLOCK_M)
    row_mask = rows < num_new
    row_positions = first_position + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < head_dim
    io_mask = row_mask[:, None] & dim_mask[None, :]
    q_ptrs = query_ptr + (q_begin + rows)[:, None] * stride_qt + head * stride_qh + dims[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=io_mask, other=0.0)
    kv_head = head // group
    table_row = block_tables_ptr + seq * stride_tb

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    # Keys before full_end are visible to every row of the tile; from there to key_end the mask applies.
    full_end = (first_position + 1) // BLOCK_N * BLOCK_N
    key_end = tl.minimum(first_position + BLOCK_M, context_len)
    acc, running_max, running_sum = _attend_key_range(
        acc, running_max, running_sum, q, row_positions, key_cache_ptr, value_cache_ptr, table_row, stride_tp,
        kv_head, dims, dim_mask, stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh,
        stride_vd, scale_log2, 0, full_end, False, PAGE_SIZE, BLOCK_N, PRECISION,
    )  # fmt: skip
    acc, running_max, running_sum = _attend_key_range(
        acc, running_max, running_sum, q, row_positions, key_cache_ptr, value_cache_ptr, table_row, stride_tp,
        kv_head, dims, dim_mask, stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh,
        stride_vd, scale_log2, full_end, key_end, True, PAGE_SIZE, BLOCK_N, PRECISION,
    )  # fmt: skip
    out = acc / running_sum[:, None]
    out_ptrs = out_ptr + (q_begin + rows)[:, None] * stride_ot + head * stride_oh + dims[None, :] * stride_od
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=io_mask)


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    tiling: PrefillTiling | None = None,
) -> torch.Tensor:
    """query [tokens, q_heads, dim] of the new tokens, sequence after sequence (query_start_loc
    [seqs + 1]); context_lens [seqs] counts cached plus new tokens; caches [num_blocks, block_size,
    kv_heads, dim] (any strides). Returns [tokens, q_heads, dim] (or fills `out`)."""
    tokens, num_q_heads, head_dim = query.shape
    num_seqs = context_lens.shape[0]
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device) if out is None else out
    if tokens == 0 or num_seqs == 0:
        return out
    tiling = tiling or default_tiling(query.dtype)
    grid = (num_q_heads, tokens // tiling.block_m + num_seqs)
    _prefill_kernel[grid](
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        query_start_loc,
        out,
        *query.stride(),
        *key_cache.stride(),
        *value_cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        scale * LOG2_E,
        num_seqs,
        num_q_heads // key_cache.shape[2],
        head_dim,
        PAGE_SIZE=key_cache.shape[1],
        BLOCK_M=tiling.block_m,
        BLOCK_N=tiling.block_n,
        BLOCK_D=triton.next_power_of_2(head_dim),
        PRECISION=dot_precision(query.dtype),
        num_warps=tiling.num_warps,
        num_stages=tiling.num_stages,
    )
    return out
