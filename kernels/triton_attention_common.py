"""What the two Triton attention kernels share: the dot precision, the paged K/V tile load, and the
online-softmax step."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

LOG2_E = 1.4426950408889634


def dot_precision(dtype: torch.dtype) -> str:
    # Triton's float32 dot defaults to tf32 (about 1e-3 relative error); float32 runs are the ones held to
    # token-identical parity with transformers, so they get IEEE float32 products.
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.cache
def multiprocessor_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_multiprocessors(device: torch.device) -> int:
    """Multiprocessors to fill; a CPU tensor (the interpreter) counts as one."""
    return multiprocessor_count(device.index or 0) if device.type == "cuda" else 1


@triton.jit
def load_paged_tile(
    cache_ptr,
    table_row_ptr,
    stride_table,
    positions,
    position_mask,
    kv_head,
    dims,
    dim_mask,
    stride_block,
    stride_slot,
    stride_head,
    stride_dim,
    PAGE_SIZE: tl.constexpr,
):
    """[len(positions), len(dims)] of one sequence's K or V for one kv head, read through its block table.
    Block ids become int64 before they multiply the block stride."""
    block = tl.load(table_row_ptr + (positions // PAGE_SIZE) * stride_table, mask=position_mask, other=0)
    row = block.to(tl.int64) * stride_block + (positions % PAGE_SIZE) * stride_slot + kv_head * stride_head
    ptrs = cache_ptr + row[:, None] + dims[None, :] * stride_dim
    return tl.load(ptrs, mask=position_mask[:, None] & dim_mask[None, :], other=0.0)


@triton.jit
def online_softmax_step(acc, running_max, running_sum, scores, values, PRECISION: tl.constexpr):
    """Fold one tile of base-2 scores [rows, keys] (masked keys at -inf) and its values [keys, dim] into
    the running (acc, max, sum). Every row must have seen at least one unmasked key by now."""
    new_max = tl.maximum(running_max, tl.max(scores, axis=1))
    correction = tl.exp2(running_max - new_max)
    probs = tl.exp2(scores - new_max[:, None])
    running_sum = running_sum * correction + tl.sum(probs, axis=1)
    acc = acc * correction[:, None] + tl.dot(probs.to(values.dtype), values, input_precision=PRECISION)
    return acc, new_max, running_sum
