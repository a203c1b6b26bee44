"""Kernels the engine calls. The torch references are the CPU path (Triton kernels join in issue [4])."""

from kvferry.kernels.reference import (
    apply_rope,
    head_rms_norm,
    paged_decode_attention,
    paged_prefill_attention,
    rms_norm,
    silu_and_mul,
    store_kv,
)

__all__ = [
    "apply_rope",
    "head_rms_norm",
    "paged_decode_attention",
    "paged_prefill_attention",
    "rms_norm",
    "silu_and_mul",
    "store_kv",
]
