"""Residual-add + RMSNorm, RoPE, SiLU-and-mul and the KV store in Triton against the torch reference,
under the interpreter."""

from __future__ import annotations

import pytest
import torch
from interpreted_kernels.cases import DTYPES, poisoned, random_tensor, strided_qkv

from kvferry.engine.model_config import RopeConfig
from kvferry.engine.rope import cos_sin_cache
from kvferry.kernels import reference
from kvferry.kernels.triton_activation import silu_and_mul
from kvferry.kernels.triton_norm import head_rms_norm, rms_norm
from kvferry.kernels.triton_rope import apply_rope
from kvferry.kernels.triton_store_kv import store_kv

# Same-dtype comparisons. The interpreter rounds float32 to bfloat16 toward zero (the GPU rounds to
# nearest), so a bfloat16 result may sit a couple of ulps off the reference: relative to the inputs
# (about 1), not to the output, where RoPE's x*cos - y*sin cancels.
TOLERANCE = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 1e-3, "rtol": 1e-3},
    torch.bfloat16: {"atol": 3.2e-2, "rtol": 3.2e-2},
}
LLAMA31_ROPE = RopeConfig(theta=500000.0, rope_type="llama3", factor=8.0, original_max_position_embeddings=8192)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_residual", [False, True])
def test_fused_residual_rms_norm(dtype, with_residual):
    generator = torch.Generator().manual_seed(10)
    # 320 columns is not a power of two: the row's tail is masked.
    x = random_tensor((7, 320), dtype, generator)
    residual = random_tensor((7, 320), dtype, generator) if with_residual else None
    weight = random_tensor((320,), dtype, generator)
    out, residual_out = poisoned(x.shape, dtype), poisoned(x.shape, dtype)
    normed, new_residual = rms_norm(x, weight, 1e-6, residual, out=out, residual_out=residual_out)
    want_normed, want_residual = reference.rms_norm(x, weight, 1e-6, residual)
    torch.testing.assert_close(normed, want_normed, **TOLERANCE[dtype])
    torch.testing.assert_close(new_residual, want_residual, **TOLERANCE[dtype])
    assert (normed is out) and (new_residual is residual_out if with_residual else new_residual is x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_head_rms_norm_on_strided_heads(dtype, head_dim):
    generator = torch.Generator().manual_seed(11)
    q, _, _ = strided_qkv(5, 4, 2, head_dim, dtype, generator)
    weight = random_tensor((head_dim,), dtype, generator)
    out = poisoned(q.shape, dtype)
    head_rms_norm(q, weight, 1e-6, out=out)
    torch.testing.assert_close(out, reference.head_rms_norm(q, weight, 1e-6), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rope_llama31_table_on_strided_q_k(dtype, head_dim):
    generator = torch.Generator().manual_seed(12)
    q, k, _ = strided_qkv(6, 8, 2, head_dim, dtype, generator)
    table = cos_sin_cache(LLAMA31_ROPE, head_dim, 20000)
    positions = torch.tensor([0, 1, 17, 8191, 8192, 19999])
    q_out, k_out = poisoned(q.shape, dtype), poisoned(k.shape, dtype)
    apply_rope(q, k, positions, table, q_out=q_out, k_out=k_out)
    want_q, want_k = reference.apply_rope(q, k, positions, table)
    torch.testing.assert_close(q_out, want_q, **TOLERANCE[dtype])
    torch.testing.assert_close(k_out, want_k, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_and_mul_across_block_boundaries(dtype):
    generator = torch.Generator().manual_seed(13)
    # width 1100 crosses the 1024-wide column block; a column slice makes the rows strided.
    gate_up = random_tensor((3, 2300), dtype, generator)[:, :2200]
    out = poisoned((3, 1100), dtype)
    silu_and_mul(gate_up, out=out)
    torch.testing.assert_close(out, reference.silu_and_mul(gate_up), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_store_kv_writes_exactly_the_mapped_slots(dtype, head_dim):
    generator = torch.Generator().manual_seed(14)
    _, key, value = strided_qkv(5, 4, 2, head_dim, dtype, generator)
    pool = poisoned((12, 3, 2, 16, 2, head_dim), dtype)  # [blocks, layers, K/V, slots, heads, dim]
    slots = torch.tensor([0, 17, 18, 95, 11 * 16 + 15])  # several blocks, a block's first and last slot
    store_kv(key, value, pool[:, 1, 0], pool[:, 1, 1], slots)
    want = poisoned(pool.shape, dtype)
    reference.store_kv(key, value, want[:, 1, 0], want[:, 1, 1], slots)
    torch.testing.assert_close(pool, want, rtol=0, atol=0, equal_nan=True)  # the rest still NaN


def test_store_kv_to_block_ids_above_65535():
    generator = torch.Generator().manual_seed(15)
    _, key, value = strided_qkv(3, 4, 1, 64, torch.bfloat16, generator)
    pool = poisoned((70000, 1, 2, 2, 1, 64), torch.bfloat16)
    slots = torch.tensor([65536 * 2, 65536 * 2 + 3, 69999 * 2 + 1])
    store_kv(key, value, pool[:, 0, 0], pool[:, 0, 1], slots)
    want = poisoned(pool.shape, torch.bfloat16)
    reference.store_kv(key, value, want[:, 0, 0], want[:, 0, 1], slots)
    torch.testing.assert_close(pool, want, rtol=0, atol=0, equal_nan=True)
