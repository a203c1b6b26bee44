"""Paged decode attention in Triton: one query token per sequence over its whole paged context.

Split-K: the context of each sequence is cut into `num_splits` equal spans, one program per
(sequence, kv head, span). Each program loads a span's K/V once for all the query heads of its GQA group
(the group is the M side of the dot, padded to 16) and keeps an online softmax. With one span it writes
the output directly; with more it writes its normalized partial output and log-sum-exp, takes a ticket
from a per-(sequence, kv head) counter, and the program that takes the last ticket merges the spans and
sets the counter back to zero. So decode attention is one launch at every split count (a separate merge
kernel cost a launch and ~3-5 us a layer on an H200). Splitting is what keeps the GPU full when
batch * kv_heads alone gives too few programs (batch 1 at 32k context: 8 programs for 132 SMs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvferry.kernels import pdl
from kvferry.kernels.pdl import wait_for_predecessor
from kvferry.kernels.triton_attention_common import (
    LOG2_E,
    device_multiprocessors,
    dot_precision,
    load_paged_tile,
    online_softmax_step,
)

# Short spans spend more on partial outputs and the merge than they add in parallelism: on an H200 at
# batch 64 x 4k, 64 spans of 64 tokens ran 30% slower than 1 span (benchmarks/kernels.py --tune).
MIN_SPLIT_TOKENS = 256
MAX_SPLITS = 64
# About two programs per multiprocessor: on an H100 at batch 1 (8 kv heads) 32 spans beat 16, 48 and 64 at
# 4k-64k context (16k: 31 us against 38 at 64), and batch 16 ran best at 2-4 spans (benchmarks/kernels.py
# --tune).
PROGRAMS_PER_SM = 2
# The most (head, span) rows of partial outputs the merge loads at once: [128, head_dim] float32 is 128
# registers a thread at 4 warps; more spill.
MERGE_ROWS = 128


@dataclass(frozen=True)
class DecodeTiling:
    """The defaults were within noise of the best of 18 tilings on an H200 (--tune, bf16, head dim 128)
    for unsplit batches (batch 64 x 4k, 256 x 1k)."""

    block_n: int = 64  # context tokens per tile
    num_warps: int = 4
    num_stages: int = 2


DEFAULT_TILING = DecodeTiling()
# Split launches run about two programs per multiprocessor, so each program needs more bytes in flight:
# 128-token tiles were the fastest of 5 tilings at batch 1 from 4k to 64k context on an H100 (16k: 31 us
# against 34 with 64-token tiles) and level at batch 16; unsplit, 64-token tiles stay ahead (batch 64 x 4k:
# 362 us against 377).
SPLIT_TILING = DecodeTiling(block_n=128)


@triton.jit
def _merge_spans(partial_out_ptr, partial_lse_ptr, out_ptr, seq, kv_head, group, dims, dim_mask, num_splits,
                 stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, stride_ob, stride_oh, stride_od,
                 BLOCK_M: tl.constexpr, MERGE_M: tl.constexpr, BLOCK_S: tl.constexpr):  # fmt: skip
    """Weigh the spans' partial outputs by their log-sum-exps, MERGE_M query heads of the group and every
    span in one load. The merge is on the critical path of the last program, where a head at a time made
    each head a dependent round trip to L2 (about 3 us of a 35 us batch-1 attention at 16k context on an
    H100), and a span at a time, before that, cost more than the whole attention. MERGE_M keeps a load to
    128 (head, span) rows of partials: more spilled registers. The partials come from other programs, so
    they are read from L2 (.cg), never from a stale L1 line."""
    splits = tl.arange(0, BLOCK_S)
    for first in tl.static_range(0, BLOCK_M, MERGE_M):
        members = first + tl.arange(0, MERGE_M)
        member_mask = members < group
        heads = kv_head * group + members
        lse_mask = member_mask[:, None] & (splits < num_splits)[None, :]
        # A head's first span always holds a key, so its `best` is finite; an empty span (log-sum-exp -inf)
        # and the padding past num_splits weigh zero. Padded members get a finite `best` and are not stored.
        lse = tl.load(partial_lse_ptr + seq * stride_plb + heads[:, None] * stride_plh + splits[None, :],
                      mask=lse_mask, other=float("-inf"), cache_modifier=".cg")  # fmt: skip
        best = tl.where(member_mask, tl.max(lse, axis=1), 0.0)
        weight = tl.exp2(lse - best[:, None])
        parts = tl.load(partial_out_ptr + seq * stride_pob + heads[:, None, None] * stride_poh
                        + splits[None, :, None] * stride_pos + dims[None, None, :],
                        mask=lse_mask[:, :, None] & dim_mask[None, None, :], other=0.0, cache_modifier=".cg")  # fmt: skip
        total = tl.where(member_mask, tl.sum(weight, axis=1), 1.0)
        out = tl.sum(parts * weight[:, :, None], axis=1) / total[:, None]
        tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :] * stride_od,
                 out.to(out_ptr.dtype.element_ty), mask=member_mask[:, None] & dim_mask[None, :])  # fmt: skip


@triton.jit
def _decode_kernel(
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    counters_ptr,
    out_ptr,
    stride_qb,
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
    stride_pob,
    stride_poh,
    stride_pos,
    stride_plb,
    stride_plh,
    stride_ob,
    stride_oh,
    stride_od,
    scale_log2,
    num_splits,
    num_kv_heads,
    group,
    head_dim,
    PAGE_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    MERGE_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_predecessor(PDL)
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    span = tl.cdiv(tl.cdiv(context_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * span
    end = tl.minimum(start + span, context_len)

    rows = tl.arange(0, BLOCK_G)
    heads = kv_head * group + rows
    row_mask = rows < group
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < head_dim
    q_ptrs = query_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_mask[:, None] & dim_mask[None, :], other=0.0)
    table_row = block_tables_ptr + seq * stride_tb

    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    running_max = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([BLOCK_G], dtype=tl.float32)
    for tile in range(start, end, BLOCK_N):
        positions = tile + tl.arange(0, BLOCK_N)
        valid = positions < end
        k = load_paged_tile(key_cache_ptr, table_row, stride_tp, positions, valid, kv_head, dims, dim_mask,
                            stride_kb, stride_ks, stride_kh, stride_kd, PAGE_SIZE)  # fmt: skip
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        scores = tl.where(valid[None, :], scores, float("-inf"))
        v = load_paged_tile(value_cache_ptr, table_row, stride_tp, positions, valid, kv_head, dims, dim_mask,
                            stride_vb, stride_vs, stride_vh, stride_vd, PAGE_SIZE)  # fmt: skip
        acc, running_max, running_sum = online_softmax_step(acc, running_max, running_sum, scores, v, PRECISION)

    # A span past the end of a short context saw no key: it writes zeros and a log-sum-exp of -inf,
    # which the merge weighs at zero.
    seen = running_sum > 0
    out = acc / tl.where(seen, running_sum, 1.0)[:, None]
    mask = row_mask[:, None] & dim_mask[None, :]
    # The two branches name their pointers apart: Triton wants a name to keep one type across an if.
    if num_splits == 1:
        final_ptrs = out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :] * stride_od
        tl.store(final_ptrs, out.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        lse = tl.where(seen, running_max + tl.log2(running_sum), float("-inf"))
        partial_ptrs = partial_out_ptr + seq * stride_pob + heads[:, None] * stride_poh + split * stride_pos
        tl.store(partial_ptrs + dims[None, :], out, mask=mask)
        tl.store(partial_lse_ptr + seq * stride_plb + heads * stride_plh + split, lse, mask=row_mask)
        # Every thread's stores are issued before the one ticket is taken; the ticket's acq_rel order then
        # makes them visible to whichever program takes the last ticket.
        tl.debug_barrier()
        counter = counters_ptr + seq * num_kv_heads + kv_head
        ticket = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        if ticket == num_splits - 1:
            _merge_spans(partial_out_ptr, partial_lse_ptr, out_ptr, seq, kv_head, group, dims, dim_mask, num_splits,
                         stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, stride_ob, stride_oh, stride_od,
                         BLOCK_M, MERGE_M, BLOCK_S)  # fmt: skip
            tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")  # ready for the next launch


# Per device, the counters the spans of one (sequence, kv head) take tickets from. Every launch leaves them
# at zero. A buffer is never freed: CUDA graphs captured with it keep its address, so a larger one, when
# a larger batch needs it, is added beside it. Two decode attentions running at once on different streams
# of one process would share them; the engine runs one stream.
_COUNTERS: dict[torch.device, list[torch.Tensor]] = {}


def split_counters(count: int, device: torch.device) -> torch.Tensor:
    buffers = _COUNTERS.setdefault(device, [])
    if not buffers or buffers[-1].numel() < count:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("decode attention needs its split counters allocated before graph capture")
        buffers.append(torch.zeros(max(count, 4096), dtype=torch.int32, device=device))
    return buffers[-1]


def choose_num_splits(batch: int, num_kv_heads: int, max_context: int, device: torch.device) -> int:
    """About PROGRAMS_PER_SM programs per multiprocessor, no span shorter than MIN_SPLIT_TOKENS, rounded
    down to a power of two: a count just past one pads the merge's span axis to the next and leaves a span
    empty (33 spans at batch 1 x 16k on an H100's 132 multiprocessors: 33.6 us, against 31.2 for 32)."""
    wanted = PROGRAMS_PER_SM * device_multiprocessors(device) // (batch * num_kv_heads)
    splits = max(1, min(wanted, triton.cdiv(max_context, MIN_SPLIT_TOKENS), MAX_SPLITS))
    return 1 << (splits.bit_length() - 1)


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    tiling: DecodeTiling | None = None,
) -> torch.Tensor:
    """query [batch, q_heads, dim]; caches [num_blocks, block_size, kv_heads, dim] (any strides);
    block_tables [batch, max_blocks]; context_lens [batch], each at least 1. Returns [batch, q_heads, dim]
    (or fills `out`). The span count comes from the block tables' width, not the lengths' values, so no
    device-to-host copy is needed."""
    batch, num_q_heads, head_dim = query.shape
    page_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device) if out is None else out
    if batch == 0:
        return out
    if num_splits is None:
        num_splits = choose_num_splits(batch, num_kv_heads, block_tables.shape[1] * page_size, query.device)
    if tiling is None:
        tiling = SPLIT_TILING if num_splits > 1 else DEFAULT_TILING
    block_m, block_s = triton.next_power_of_2(group), max(2, triton.next_power_of_2(num_splits))
    partial_out = torch.empty(batch, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
    partial_lse = torch.empty(batch, num_q_heads, num_splits, dtype=torch.float32, device=query.device)
    use_pdl = pdl.enabled(query)
    _decode_kernel[(batch, num_kv_heads, num_splits)](
        query,
        key_cache,
        value_cache,
        block_tables,
        context_lens,
        partial_out,
        partial_lse,
        split_counters(batch * num_kv_heads, query.device),
        out,
        *query.stride(),
        *key_cache.stride(),
        *value_cache.stride(),
        *block_tables.stride(),
        *partial_out.stride()[:3],
        *partial_lse.stride()[:2],
        *out.stride(),
        scale * LOG2_E,
        num_splits,
        num_kv_heads,
        group,
        head_dim,
        PAGE_SIZE=page_size,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_M=block_m,
        MERGE_M=max(1, min(block_m, MERGE_ROWS // block_s)),
        BLOCK_N=tiling.block_n,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_S=block_s,
        PRECISION=dot_precision(query.dtype),
        PDL=use_pdl,
        num_warps=tiling.num_warps,
        num_stages=tiling.num_stages,
        launch_pdl=use_pdl,
    )
    return out
