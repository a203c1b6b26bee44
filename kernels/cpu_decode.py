"""The CPU's decode-step kernels for float32 and bfloat16, each one C call (kernels/_cpu_decode.c): paged
decode attention reading K and V in place from the pool's blocks, RMSNorm with its residual add, RoPE with the
KV store, and SiLU-and-mul.

torch's path (kernels/reference.py) reaches the same results through several op calls each (attention alone
about fifteen a layer: gathering the blocks, converting them to float32, two matmuls, a mask, a softmax),
and on the CPU each call is a fixed cost. RoPE and the residual add are bit for bit the reference's; the
norm, the softmax and SiLU differ only in float32's last bits (tests/unit/test_cpu_decode.py). float32's
greedy parity with transformers holds on them as it held on the reference (tests/integration). float16 stays
on the reference.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import torch

from kvferry.native_library import NativeLibrary

LIBRARY = NativeLibrary(Path(__file__).with_name("_cpu_decode.c"), "kvferry.kernels' CPU decode-step kernels",
                        ("-O3", "-fopenmp", "-fno-math-errno", "-lm"),
                        ("_cpu_bf16_bits.h", "_cpu_decode_kernels.h"))  # fmt: skip
MAX_HEAD_DIM = 256  # as the C file's
MAX_GROUP = 32
_REFUSALS = {-1: "an unsupported shape", -2: "no memory for the scores", -3: "a context longer than its block table",
             -4: "a block id outside the pool", -5: "a position outside the RoPE table",
             -6: "a slot outside the pool"}  # fmt: skip

_int64, _pointer, _float = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
_KERNELS = {  # name without its type's suffix: (restype, argtypes)
    "kvf_decode_attention": (ctypes.c_int, [_pointer] * 4 + [_int64] * 2 + [_pointer] * 2 + [_int64] * 9 + [_float]
                             + [_int64]),
    "kvf_rms_norm": (None, [_pointer] * 5 + [_int64] * 2 + [_float]),
    "kvf_rope_store_kv": (ctypes.c_int, [_pointer] * 3 + [_int64, _pointer, _pointer, _int64] + [_pointer] * 4
                          + [_int64] * 9),
    "kvf_silu_and_mul": (None, [_pointer] * 2 + [_int64] * 2),
}  # fmt: skip
_SUFFIXES = {torch.float32: "_f32", torch.bfloat16: "_bf16"}  # the types the kernels take, and their names' suffix
# (kernel, dtype): its C function, looked up once when the library loads on first use (a process that never
# runs them never builds it), not by name on every call
_functions: dict[tuple[str, torch.dtype], Callable[..., int | None]] = {}


def _call(kernel: str, dtype: torch.dtype, *args: object) -> int | None:
    if not _functions:
        library = LIBRARY.load({name + suffix: signature for name, signature in _KERNELS.items()
                                for suffix in _SUFFIXES.values()})  # fmt: skip
        _functions.update({(name, dtype): getattr(library, name + suffix) for name in _KERNELS
                           for dtype, suffix in _SUFFIXES.items()})  # fmt: skip
    return _functions[kernel, dtype](*args)


def _checked(status: int | None, what: str) -> None:
    if status:
        raise ValueError(f"{what} refused {_REFUSALS.get(status, status)}")


# The checks below run before every call: plain comparisons, as each torch call costs microseconds here.


def norm_applies(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """float32 or bfloat16 rows, the weight and the residual of their type (the caller's CPU tensors:
    dispatch's "native" side)."""
    return x.dtype in _SUFFIXES and weight.dtype == x.dtype and (residual is None or residual.dtype == x.dtype)


def attention_applies(query: torch.Tensor, key_cache: torch.Tensor) -> bool:
    """float32 or bfloat16, the cache of the query's type, in shapes the attention kernel takes."""
    num_q_heads, head_dim, num_kv_heads = query.shape[1], query.shape[2], key_cache.shape[2]
    return (
        query.dtype in _SUFFIXES
        and key_cache.dtype == query.dtype
        and head_dim <= MAX_HEAD_DIM
        and num_q_heads % num_kv_heads == 0
        and num_q_heads // num_kv_heads <= MAX_GROUP
    )


def rope_applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_cache: torch.Tensor) -> bool:
    """float32 or bfloat16, the cache of q's type, q, k and v [tokens, heads, dim] views of one qkv row each:
    the same row stride (any, for one token), heads packed (the model's split of its qkv matmul; a q/k norm
    makes new tensors, which the reference takes)."""
    if q.dtype not in _SUFFIXES or key_cache.dtype != q.dtype:
        return False
    row, dim, one_token = q.stride(0), q.shape[2], q.shape[0] == 1
    for part in (q, k, v):  # a loop of plain comparisons: all() over a generator took twice as long
        token_stride, head_stride, element_stride = part.stride()
        if element_stride != 1 or head_stride != dim or not (one_token or token_stride == row):
            return False
    return True


def silu_applies(gate_up: torch.Tensor) -> bool:
    """float32 or bfloat16."""
    return gate_up.dtype in _SUFFIXES


def _packed(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The tensor itself when it already is packed and of `dtype` (the engine's own tensors are)."""
    return tensor if tensor.dtype == dtype and tensor.is_contiguous() else tensor.to(dtype).contiguous()


def _same_views(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    if value_cache.stride() != key_cache.stride() or value_cache.shape != key_cache.shape or key_cache.stride(3) != 1:
        raise ValueError("the key and value caches must be views of the same shape and strides, dim's packed")


def paged_decode_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """reference.paged_decode_attention's result (see `attention_applies`). The caches are the pool's strided
    per-layer views, [num_blocks, block_size, kv_heads, dim]."""
    _same_views(key_cache, value_cache)
    dtype = key_cache.dtype
    query, tables, lengths = _packed(query, dtype), _packed(block_tables, torch.int64), _packed(context_lens, torch.int64)
    out = torch.empty_like(query)
    batch, num_q_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads = key_cache.shape[:3]
    _checked(_call(
        "kvf_decode_attention", dtype, query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
        tables.data_ptr(), tables.stride(0), tables.shape[1], lengths.data_ptr(), out.data_ptr(), batch, num_q_heads,
        num_kv_heads, head_dim, num_blocks, block_size, key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        scale, torch.get_num_threads(),
    ), "CPU decode attention")  # fmt: skip
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """reference.rms_norm (see `norm_applies`): (normalized, new residual)."""
    dtype = x.dtype
    x, weight = _packed(x, dtype), _packed(weight, dtype)
    out = torch.empty_like(x)
    width = x.shape[-1]
    if residual is None:  # no add: the row itself is the residual, as the reference returns it
        _call("kvf_rms_norm", dtype, x.data_ptr(), None, weight.data_ptr(), out.data_ptr(), None, x.numel() // width,
              width, eps)  # fmt: skip
        return out, x
    residual, summed = _packed(residual, dtype), torch.empty_like(x)
    _call("kvf_rms_norm", dtype, x.data_ptr(), residual.data_ptr(), weight.data_ptr(), out.data_ptr(),
          summed.data_ptr(), x.numel() // width, width, eps)  # fmt: skip
    return out, summed


def apply_rope_and_store_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                            cos_sin_cache: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                            slot_mapping: torch.Tensor) -> torch.Tensor:
    """reference.apply_rope_and_store_kv (see `rope_applies`): q, k, v [tokens, heads, dim] are views of one
    qkv row each (the same row stride, heads packed); returns the rotated q, packed."""
    _same_views(key_cache, value_cache)
    if not rope_applies(q, k, v, key_cache):
        raise ValueError("q, k and v must be float32 or bfloat16 head-packed views of one qkv row each, the cache "
                         "of their type")  # fmt: skip
    token_stride = q.stride(0)
    table = _packed(cos_sin_cache, torch.float32)
    positions, slots = _packed(positions, torch.int64), _packed(slot_mapping, torch.int64)
    tokens, num_q_heads, head_dim = q.shape
    rotated = torch.empty(tokens, num_q_heads, head_dim, dtype=q.dtype)
    num_blocks, block_size, num_kv_heads = key_cache.shape[:3]
    _checked(_call(
        "kvf_rope_store_kv", q.dtype, q.data_ptr(), k.data_ptr(), v.data_ptr(), token_stride, positions.data_ptr(),
        table.data_ptr(), table.shape[0], key_cache.data_ptr(), value_cache.data_ptr(), slots.data_ptr(),
        rotated.data_ptr(), tokens, num_q_heads, num_kv_heads, head_dim, num_blocks, block_size, key_cache.stride(0),
        key_cache.stride(1), key_cache.stride(2),
    ), "CPU RoPE")  # fmt: skip
    return rotated


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """reference.silu_and_mul (see `silu_applies`): SiLU of the first half of each row times its second half."""
    gate_up = _packed(gate_up, gate_up.dtype)
    width = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], width, dtype=gate_up.dtype)
    _call("kvf_silu_and_mul", gate_up.dtype, gate_up.data_ptr(), out.data_ptr(), gate_up.numel() // (2 * width), width)
    return out
