"""Kernels the engine calls: Triton on CUDA, the torch references on the CPU (see dispatch.py)."""

from kvferry.kernels.dispatch import (
    apply_rope,
    apply_rope_and_store_kv,
    head_rms_norm,
    linear,
    paged_decode_attention,
    paged_prefill_attention,
    rms_norm,
    silu_and_mul,
    store_kv,
)

__all__ = [
    "apply_rope",
    "apply_rope_and_store_kv",
    "head_rms_norm",
    "linear",
    "paged_decode_attention",
    "paged_prefill_attention",
    "rms_norm",
    "silu_and_mul",
    "store_kv",
]
