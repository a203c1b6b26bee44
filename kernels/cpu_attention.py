"""bfloat16 paged decode attention on the CPU in one C call (kernels/_cpu_attention.c), reading K and V in
place from the pool's blocks.

torch's path (kernels/reference.py) gathers the blocks, converts them to float32 and runs two matmuls and a
softmax: about fifteen op calls a layer, a fixed cost each. The C kernel computes the same in float32 (only
the order of the sums differs) in one call. On the development machine (one thread, 9 query heads over 3 of
64 dims, ~190-token contexts, a probe): 0.10 -> 0.04 ms a layer for one sequence, 0.9 -> 0.6 ms for 16.
float32 stays on torch's SDPA, whose arithmetic is transformers' (greedy parity), and float16 on the
reference.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kvferry.native_library import NativeLibrary

LIBRARY = NativeLibrary(Path(__file__).with_name("_cpu_attention.c"), "kvferry.kernels' CPU attention",
                        ("-O3", "-fopenmp-simd", "-fno-math-errno", "-lm"))  # fmt: skip
MAX_HEAD_DIM = 256  # as the C file's
MAX_GROUP = 32
_ERRORS = {-1: "an unsupported shape", -2: "no memory for the scores", -3: "a context longer than its block table",
           -4: "a block id outside the pool"}  # fmt: skip

_int64, _pointer = ctypes.c_int64, ctypes.c_void_p
_kernel = None  # loaded on first use: a process that never decodes in bfloat16 on the CPU never builds it


def _loaded() -> ctypes._CFuncPtr:
    global _kernel
    if _kernel is None:
        kernel = LIBRARY.load().kvf_decode_attention_bf16
        kernel.restype = ctypes.c_int
        kernel.argtypes = [_pointer] * 4 + [_int64] * 2 + [_pointer] * 2 + [_int64] * 9 + [ctypes.c_float]
        _kernel = kernel
    return _kernel


def applies(query: torch.Tensor, key_cache: torch.Tensor) -> bool:
    """bfloat16 on the CPU, in shapes the kernel takes."""
    num_q_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = key_cache.shape[2]
    return (
        query.dtype == torch.bfloat16
        and key_cache.dtype == torch.bfloat16
        and query.device.type == "cpu"
        and head_dim <= MAX_HEAD_DIM
        and num_q_heads % num_kv_heads == 0
        and num_q_heads // num_kv_heads <= MAX_GROUP
        and key_cache.stride(3) == 1
    )


def paged_decode_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """reference.paged_decode_attention's result for bfloat16 (see `applies`). The caches are the pool's
    strided per-layer views, [num_blocks, block_size, kv_heads, dim], K and V with the same strides."""
    if value_cache.stride() != key_cache.stride() or value_cache.shape != key_cache.shape:
        raise ValueError("the key and value caches must be views of the same shape and strides")
    query = query.contiguous()
    tables = block_tables.to(torch.int64).contiguous()
    lengths = context_lens.to(torch.int64).contiguous()
    out = torch.empty_like(query)
    batch, num_q_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads = key_cache.shape[:3]
    status = _loaded()(
        query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), tables.data_ptr(), tables.stride(0),
        tables.shape[1], lengths.data_ptr(), out.data_ptr(), batch, num_q_heads, num_kv_heads, head_dim,
        num_blocks, block_size, key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), scale,
    )  # fmt: skip
    if status:
        raise ValueError(f"CPU decode attention refused {_ERRORS.get(status, status)}")
    return out
