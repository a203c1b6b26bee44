"""One entry point per kernel: Triton on CUDA tensors, the torch reference everywhere else, but for the
float32 and bfloat16 decode step's kernels on the CPU, each one C call (kernels/cpu_decode.py).

`KVFERRY_KERNELS` forces a side: `triton` (also on CPU tensors, which then needs `TRITON_INTERPRET=1`),
`torch` (the reference, also on CUDA and in place of the C kernels), or `auto`, the default. It is read on
every call, so a benchmark or a test can switch sides within one process.

The Triton modules are imported on first use, not with this package: a CPU process never loads triton,
and a process that interprets the kernels can set `TRITON_INTERPRET` before the first import decides
between compiling and interpreting them.

kernels/ has no __init__.py, like operator/: a source checkout's root on sys.path (`python -m` from
there) would otherwise put this folder in place of Hugging Face's `kernels` package, which
transformers imports when it finds one installed.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from kvferry.kernels import cpu_decode, cpu_linear, fp8_linear, int4_linear, int8_linear, reference
from kvferry.kernels.fp8_weight import Fp8Weight
from kvferry.kernels.int4_linear import Int4Weight
from kvferry.kernels.int8_linear import Int8Weight

BACKEND_VARIABLE = "KVFERRY_KERNELS"
BACKENDS = ("auto", "triton", "torch")
# A linear layer's weight as the engine keeps it: the model's dtype, FP8, int8 or int4.
LinearWeight = torch.Tensor | Fp8Weight | Int8Weight | Int4Weight


def side(tensor: torch.Tensor) -> str:
    """Where the kernel for this input runs, by the variable (read once a call) and the tensor's device:
    "triton", "torch" (the reference), or "native" (the CPU's C kernels where they take the input, else the
    reference)."""
    choice = os.environ.get(BACKEND_VARIABLE, "auto")
    if choice == "auto":
        return "triton" if tensor.is_cuda else "native"
    if choice not in BACKENDS:
        raise ValueError(f"{BACKEND_VARIABLE} must be one of {BACKENDS}, got {choice!r}")
    return choice


def use_triton(tensor: torch.Tensor) -> bool:
    """Whether the kernel for this input runs in Triton."""
    return side(tensor) == "triton"


def linear(x: torch.Tensor, weight: LinearWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear; one 16-bit row without a bias (a batch-1 decode step) takes the Triton GEMV, which
    reads the weights faster than cuBLAS does for one row (kernels/triton_linear.py), and a decode batch
    of up to 64 rows the weight-streaming GEMM where the weight is large (kernels/triton_batch_gemm.py);
    up to a few hundred float32 or bfloat16 rows on the CPU (a decode batch) take prepacked weights,
    kvferry's C kernel or oneDNN's (kernels/cpu_linear.py); FP8 weights go to kernels/fp8_linear.py, int8
    ones to kernels/int8_linear.py, int4 ones to kernels/int4_linear.py."""
    if isinstance(weight, Fp8Weight):
        return fp8_linear.linear(x, weight, bias, use_triton(x))
    if isinstance(weight, Int8Weight):
        return int8_linear.linear(x, weight, bias, side(x) == "native")
    if isinstance(weight, Int4Weight):
        return int4_linear.linear(x, weight, bias)
    if cpu_linear.applies(x, weight):
        return cpu_linear.linear(x, weight, bias, side(x) == "native")
    if x.dim() == 2 and bias is None and x.dtype in (torch.bfloat16, torch.float16) and use_triton(x):
        from kvferry.kernels import (  # here: Triton is imported for the GPU only
            triton_batch_gemm,
            triton_linear,
        )

        if x.shape[0] == 1:
            return triton_linear.gemv(x, weight)
        if triton_batch_gemm.streams_faster(x, weight):
            return triton_batch_gemm.batch_gemm(x, weight)
    return F.linear(x, weight, bias)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    where = side(x)
    if where == "triton":
        from kvferry.kernels import triton_norm

        return triton_norm.rms_norm(x, weight, eps, residual)
    if where == "native" and cpu_decode.norm_applies(x, weight, residual):
        return cpu_decode.rms_norm(x, weight, eps, residual)
    return reference.rms_norm(x, weight, eps, residual)


def head_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if use_triton(x):
        from kvferry.kernels import triton_norm

        return triton_norm.head_rms_norm(x, weight, eps)
    return reference.head_rms_norm(x, weight, eps)


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(q):
        from kvferry.kernels import triton_rope

        return triton_rope.apply_rope(q, k, positions, cos_sin_cache)
    return reference.apply_rope(q, k, positions, cos_sin_cache)


def apply_rope_and_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """RoPE on q and k, the rotated k and v into their pool slots; returns the rotated q."""
    args = (q, k, v, positions, cos_sin_cache, key_cache, value_cache, slot_mapping)
    where = side(q)
    if where == "triton":
        from kvferry.kernels import triton_rope

        return triton_rope.apply_rope_and_store_kv(*args)
    if where == "native" and cpu_decode.rope_applies(q, k, v, key_cache):
        return cpu_decode.apply_rope_and_store_kv(*args)
    return reference.apply_rope_and_store_kv(*args)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    where = side(gate_up)
    if where == "triton":
        from kvferry.kernels import triton_activation

        return triton_activation.silu_and_mul(gate_up)
    if where == "native" and cpu_decode.silu_applies(gate_up):
        return cpu_decode.silu_and_mul(gate_up)
    return reference.silu_and_mul(gate_up)


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    if use_triton(key):
        from kvferry.kernels import triton_store_kv

        triton_store_kv.store_kv(key, value, key_cache, value_cache, slot_mapping)
    else:
        reference.store_kv(key, value, key_cache, value_cache, slot_mapping)


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    where = side(query)
    if where == "triton":
        from kvferry.kernels import triton_decode_attention

        return triton_decode_attention.paged_decode_attention(
            query, key_cache, value_cache, block_tables, context_lens, scale
        )
    if where == "native" and cpu_decode.attention_applies(query, key_cache):
        return cpu_decode.paged_decode_attention(query, key_cache, value_cache, block_tables, context_lens, scale)
    return reference.paged_decode_attention(query, key_cache, value_cache, block_tables, context_lens, scale)


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    if use_triton(query):
        from kvferry.kernels import triton_prefill_attention

        return triton_prefill_attention.paged_prefill_attention(
            query, key_cache, value_cache, block_tables, context_lens, query_start_loc, scale
        )
    return reference.paged_prefill_attention(
        query, key_cache, value_cache, block_tables, context_lens, query_start_loc, scale
    )
