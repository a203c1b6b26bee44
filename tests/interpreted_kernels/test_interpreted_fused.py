"""The decode step's own kernels under the interpreter: RoPE + KV store in one launch, decode attention
that merges its spans in the program taking the last ticket (its counters back at zero after), and the
one-row GEMV of batch-1 decode (its FP8 counterpart: test_interpreted_fp8.py)."""

from __future__ import annotations

import pytest
import torch
from interpreted_kernels.cases import (
    ATTENTION_TOLERANCE,
    DTYPES,
    paged_kv,
    poisoned,
    random_tensor,
    strided_qkv,
)
from interpreted_kernels.test_interpreted_elementwise import LLAMA31_ROPE, TOLERANCE

from kvferry.engine.model_config import RopeConfig
from kvferry.engine.rope import cos_sin_cache
from kvferry.kernels import reference
from kvferry.kernels.triton_decode_attention import paged_decode_attention, split_counters
from kvferry.kernels.triton_linear import gemv
from kvferry.kernels.triton_rope import apply_rope_and_store_kv


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rope_and_store_kv_match_rope_then_store(dtype, head_dim):
    generator = torch.Generator().manual_seed(21)
    q, k, v = strided_qkv(5, 8, 2, head_dim, dtype, generator)
    table = cos_sin_cache(LLAMA31_ROPE, head_dim, 20000)
    positions = torch.tensor([0, 17, 8191, 8192, 19999])
    slots = torch.tensor([0, 17, 18, 95, 11 * 16 + 15])  # several blocks, a block's first and last slot
    pool = poisoned((12, 3, 2, 16, 2, head_dim), dtype)  # [blocks, layers, K/V, slots, heads, dim]
    want_pool = pool.clone()
    q_out = poisoned(q.shape, dtype)
    got_q = apply_rope_and_store_kv(q, k, v, positions, table, pool[:, 1, 0], pool[:, 1, 1], slots, q_out=q_out)
    want_q = reference.apply_rope_and_store_kv(q, k, v, positions, table, want_pool[:, 1, 0], want_pool[:, 1, 1], slots)
    assert got_q is q_out
    torch.testing.assert_close(got_q, want_q, **TOLERANCE[dtype])
    torch.testing.assert_close(pool, want_pool, **TOLERANCE[dtype], equal_nan=True)  # every other slot still NaN
    blocks, offsets = slots // 16, slots % 16
    assert torch.equal(pool[blocks, 1, 1, offsets], v)  # values are copied, not rotated


def test_rope_and_store_kv_rejects_a_strided_head_dim():
    generator = torch.Generator().manual_seed(22)
    q, k, v = strided_qkv(2, 4, 2, 64, torch.float32, generator)
    pool = poisoned((4, 1, 2, 16, 64, 2), torch.float32).transpose(-1, -2)  # head_dim with stride 2
    table = cos_sin_cache(RopeConfig(theta=10000.0), 64, 16)
    with pytest.raises(ValueError, match="contiguous"):
        apply_rope_and_store_kv(q, k, v, torch.tensor([0, 1]), table, pool[:, 0, 0], pool[:, 0, 1], torch.tensor([0, 1]))


@pytest.mark.parametrize("num_splits", [2, 5])
def test_decode_spans_merge_in_one_launch_and_leave_the_counters_at_zero(num_splits):
    generator = torch.Generator().manual_seed(23)
    lengths = [1, 45, 300, 130]  # one-token and short contexts leave later spans empty
    kv = paged_kv(lengths, 2, 64, 16, torch.float32, generator)
    args = (kv.block_tables, kv.context_lens, 64**-0.5)
    for launch in range(2):  # the second launch finds the counters the first one left
        query = random_tensor((len(lengths), 8, 64), torch.float32, generator)
        out = poisoned(query.shape, torch.float32)
        paged_decode_attention(query, kv.key_cache, kv.value_cache, *args, out=out, num_splits=num_splits)
        want = reference.paged_decode_attention(query, *kv.reference_caches(), *args)
        torch.testing.assert_close(out, want, **ATTENTION_TOLERANCE[torch.float32], msg=lambda m, n=launch: f"launch {n}: {m}")
        assert int(split_counters(len(lengths) * 2, query.device).abs().sum()) == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("n", "k"), [(13, 4096), (7, 300)])  # K in whole 2048-wide tiles, and ragged
def test_gemv_matches_a_float32_matmul(dtype, n, k):
    generator = torch.Generator().manual_seed(24)
    x = random_tensor((1, k), dtype, generator)
    weight = random_tensor((n, k), dtype, generator)
    want = torch.nn.functional.linear(x.float(), weight.float())
    got = gemv(x, weight)
    assert got.dtype == dtype and got.shape == (1, n)
    torch.testing.assert_close(got.float(), want, atol=2e-2 * float(want.abs().max()), rtol=0)
