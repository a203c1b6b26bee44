"""Every Triton kernel compiled for the GPU against the torch reference, at engine-sized shapes: Llama-3-8B
heads (32 query, 8 kv, dim 128), contexts to 32k with split-K, a pool past 2**31 elements. Skipped
without CUDA; the kernel modules are imported inside the tests so that collecting this file on a CPU
machine never imports triton."""

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

from kvferry.kernels import reference

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = "cuda"
# Context lengths off the block size, from one token to past 32k.
DECODE_LENGTHS = [1, 100, 4097, 16385, 32768 + 5]
# One ulp of each dtype, relative: RMSNorm's rsqrt may differ from torch's in its last bit, which can move a
# rounded output by one ulp.
ONE_ULP = {
    torch.float32: {"atol": 1e-5, "rtol": 1.3e-6},
    torch.float16: {"atol": 1e-5, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1e-5, "rtol": 1.6e-2},
}
# RoPE: on an H200 about 1.5% of 16-bit outputs came out one ulp of the inputs (magnitude about 1) away
# from torch's, including where x*cos - y*sin cancels to 0, so the bound is absolute as well.
ROPE_ONE_INPUT_ULP = {
    torch.float32: {"atol": 1e-5, "rtol": 1.3e-6},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
}
# (cached, new) per sequence: long fresh prompts, extensions over long prefixes, single tokens.
PREFILL_SEQS = [(0, 1000), (3000, 517), (0, 1), (100, 2048), (4095, 1)]


@pytest.fixture(autouse=True)
def _triton_dispatch(monkeypatch):
    monkeypatch.setenv("KVFERRY_KERNELS", "triton")


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim"), [(32, 8, 128), (8, 8, 64), (64, 8, 128)])
@pytest.mark.parametrize("num_splits", [None, 7])
def test_decode_attention(dtype, q_heads, kv_heads, head_dim, num_splits):
    from kvferry.kernels.triton_decode_attention import paged_decode_attention, split_counters

    generator = _generator(q_heads + head_dim)
    kv = paged_kv(DECODE_LENGTHS, kv_heads, head_dim, 16, dtype, generator, device=CUDA)
    query = random_tensor((len(DECODE_LENGTHS), q_heads, head_dim), dtype, generator, CUDA)
    args = (kv.block_tables, kv.context_lens, head_dim**-0.5)
    out = poisoned(query.shape, dtype, CUDA)
    paged_decode_attention(query, kv.key_cache, kv.value_cache, *args, out=out, num_splits=num_splits)
    want = reference.paged_decode_attention(query.float(), *kv.reference_caches(), *args)
    torch.testing.assert_close(out.float(), want, **ATTENTION_TOLERANCE[dtype])
    # The program that merged each (sequence, kv head) set its ticket counter back for the next launch.
    assert int(split_counters(len(DECODE_LENGTHS) * kv_heads, query.device).abs().sum()) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_decode_attention_one_sequence_of_64k_tokens(dtype):
    """Batch 1 at 64k context, the shape that splits the most: with the split count the engine chooses
    (about two programs per multiprocessor) and with MAX_SPLITS (64 spans of 1k tokens, the merge taking a
    group's heads in two loads)."""
    from kvferry.kernels.triton_decode_attention import (
        MAX_SPLITS,
        choose_num_splits,
        paged_decode_attention,
        split_counters,
    )

    generator = _generator(65536)
    kv = paged_kv([65536 + 3], 8, 128, 16, dtype, generator, device=CUDA)
    query = random_tensor((1, 32, 128), dtype, generator, CUDA)
    args = (kv.block_tables, kv.context_lens, 128**-0.5)
    assert choose_num_splits(1, 8, kv.block_tables.shape[1] * 16, query.device) >= 16
    want = reference.paged_decode_attention(query.float(), *kv.reference_caches(), *args)
    for num_splits in (None, MAX_SPLITS):
        out = poisoned(query.shape, dtype, CUDA)
        paged_decode_attention(query, kv.key_cache, kv.value_cache, *args, out=out, num_splits=num_splits)
        torch.testing.assert_close(out.float(), want, **ATTENTION_TOLERANCE[dtype],
                                   msg=lambda m, n=num_splits: f"{n} splits: {m}")  # fmt: skip
        assert int(split_counters(8, query.device).abs().sum()) == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("q_heads", "kv_heads", "head_dim"), [(32, 8, 128), (8, 8, 64), (64, 8, 128)])
def test_prefill_attention(dtype, q_heads, kv_heads, head_dim):
    from kvferry.kernels.triton_prefill_attention import paged_prefill_attention

    generator = _generator(q_heads * head_dim)
    kv = paged_kv([c + n for c, n in PREFILL_SEQS], kv_heads, head_dim, 16, dtype, generator, device=CUDA)
    starts = torch.tensor([0] + [n for _, n in PREFILL_SEQS], device=CUDA).cumsum(0)
    query = random_tensor((int(starts[-1]), q_heads, head_dim), dtype, generator, CUDA)
    args = (kv.block_tables, kv.context_lens, starts, head_dim**-0.5)
    out = poisoned(query.shape, dtype, CUDA)
    paged_prefill_attention(query, kv.key_cache, kv.value_cache, *args, out=out)
    want = reference.paged_prefill_attention(query.float(), *kv.reference_caches(), *args)
    torch.testing.assert_close(out.float(), want, **ATTENTION_TOLERANCE[dtype])


def test_pool_past_2_31_elements():
    """Blocks 32768 and up of a 4.3 GB pool start past element 2**31: int32 offsets would wrap there."""
    from kvferry.kernels.triton_decode_attention import paged_decode_attention
    from kvferry.kernels.triton_prefill_attention import paged_prefill_attention
    from kvferry.kernels.triton_store_kv import store_kv

    generator = _generator(5)
    dtype, lengths = torch.bfloat16, [300, 1000]
    kv = paged_kv(lengths, 8, 128, 16, dtype, generator, device=CUDA, num_blocks=33000, lowest_block_id=32768)
    assert kv.pool.numel() > 2**31 and kv.key_cache.stride(0) * 32768 >= 2**31
    query = random_tensor((2, 32, 128), dtype, generator, CUDA)
    args = (kv.block_tables, kv.context_lens, 128**-0.5)
    decoded = paged_decode_attention(query, kv.key_cache, kv.value_cache, *args, num_splits=3)
    want = reference.paged_decode_attention(query.float(), *kv.reference_caches(), *args)
    torch.testing.assert_close(decoded.float(), want, **ATTENTION_TOLERANCE[dtype])

    starts = torch.tensor([0, 20, 1020], device=CUDA)  # the last 20 and the last 1000 tokens are new
    new_query = random_tensor((1020, 32, 128), dtype, generator, CUDA)
    prefill_args = (kv.block_tables, kv.context_lens, starts, 128**-0.5)
    prefilled = paged_prefill_attention(new_query, kv.key_cache, kv.value_cache, *prefill_args)
    want = reference.paged_prefill_attention(new_query.float(), *kv.reference_caches(), *prefill_args)
    torch.testing.assert_close(prefilled.float(), want, **ATTENTION_TOLERANCE[dtype])

    _, key, value = strided_qkv(4, 32, 8, 128, dtype, generator, CUDA)
    slots = (kv.block_tables[1, :4] * 16 + torch.tensor([0, 5, 10, 15], device=CUDA)).contiguous()
    store_kv(key, value, kv.key_cache, kv.value_cache, slots)
    blocks, offsets = slots // 16, slots % 16
    assert torch.equal(kv.key_cache[blocks, offsets], key) and torch.equal(kv.value_cache[blocks, offsets], value)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_elementwise_kernels_match_the_reference(dtype):
    """Outputs within one ulp of the reference (see ONE_ULP, ROPE_ONE_INPUT_ULP); the KV store exactly (the
    fused RoPE + store: rotated keys within RoPE's bound, values exactly)."""
    from kvferry.engine.model_config import RopeConfig
    from kvferry.engine.rope import cos_sin_cache
    from kvferry.kernels import dispatch as kernels

    generator = _generator(6)
    x, residual = (random_tensor((4096, 4096), dtype, generator, CUDA) for _ in range(2))
    weight = random_tensor((4096,), dtype, generator, CUDA)
    for got, want in zip(kernels.rms_norm(x, weight, 1e-5, residual), reference.rms_norm(x, weight, 1e-5, residual),
                         strict=True):  # fmt: skip
        torch.testing.assert_close(got, want, **ONE_ULP[dtype])

    q, k, v = strided_qkv(4096, 32, 8, 128, dtype, generator, CUDA)
    torch.testing.assert_close(kernels.head_rms_norm(q, weight[:128], 1e-6), reference.head_rms_norm(q, weight[:128], 1e-6),
                               **ONE_ULP[dtype])  # fmt: skip
    table = cos_sin_cache(RopeConfig(theta=500000.0, rope_type="llama3", factor=8.0), 128, 131072).to(CUDA)
    positions = torch.randint(0, 131072, (4096,), generator=generator).to(CUDA)
    for got, want in zip(kernels.apply_rope(q, k, positions, table), reference.apply_rope(q, k, positions, table),
                         strict=True):  # fmt: skip
        torch.testing.assert_close(got, want, **ROPE_ONE_INPUT_ULP[dtype])

    pool = poisoned((600, 2, 2, 16, 8, 128), dtype, CUDA)
    want_pool = pool.clone()
    slots = torch.randperm(600 * 16, generator=generator)[:4096].to(CUDA)
    got_q = kernels.apply_rope_and_store_kv(q, k, v, positions, table, pool[:, 1, 0], pool[:, 1, 1], slots)
    want_q = reference.apply_rope_and_store_kv(q, k, v, positions, table, want_pool[:, 1, 0], want_pool[:, 1, 1], slots)
    torch.testing.assert_close(got_q, want_q, **ROPE_ONE_INPUT_ULP[dtype])
    torch.testing.assert_close(pool[:, 1, 0], want_pool[:, 1, 0], **ROPE_ONE_INPUT_ULP[dtype], equal_nan=True)
    torch.testing.assert_close(pool[:, 1, 1], want_pool[:, 1, 1], rtol=0, atol=0, equal_nan=True)
    assert pool[:, 0].isnan().all()  # the other layer untouched

    gate_up = random_tensor((4096, 2 * 14336), dtype, generator, CUDA)
    torch.testing.assert_close(kernels.silu_and_mul(gate_up), reference.silu_and_mul(gate_up), **ONE_ULP[dtype])

    pool = poisoned((600, 2, 2, 16, 8, 128), dtype, CUDA)
    want_pool = pool.clone()
    slots = torch.randperm(600 * 16, generator=generator)[:4096].to(CUDA)
    kernels.store_kv(k, v, pool[:, 1, 0], pool[:, 1, 1], slots)
    reference.store_kv(k, v, want_pool[:, 1, 0], want_pool[:, 1, 1], slots)
    torch.testing.assert_close(pool, want_pool, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 14336), (128256, 4096), (301, 1000)])
def test_one_row_linear_matches_float32_matmul(dtype, n, k):
    """The batch-1 GEMV against a float32 matmul of the same 16-bit inputs, rounded like the output."""
    from kvferry.kernels import dispatch as kernels

    generator = _generator(n + k)
    x = random_tensor((1, k), dtype, generator, CUDA)
    weight = (random_tensor((n, k), dtype, generator, CUDA) * 0.02).to(dtype)
    got = kernels.linear(x, weight)
    want = torch.nn.functional.linear(x.float(), weight.float())
    assert got.dtype == dtype and got.shape == (1, n)
    torch.testing.assert_close(got.float(), want, atol=2e-3 * float(want.abs().max()), rtol=ONE_ULP[dtype]["rtol"])



@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("rows", [2, 17, 64])
@pytest.mark.parametrize(("n", "k"), [(28672, 4096), (4096, 14336), (32771, 1040)])  # the last ragged in N and K
def test_decode_batch_linear_of_a_large_weight_matches_float32_matmul(dtype, rows, n, k):
    """A decode batch times a weight large enough for the weight-streaming GEMM (kernels/triton_batch_gemm.py),
    against a float32 matmul of the same 16-bit inputs, rounded like the output."""
    from kvferry.kernels import dispatch as kernels
    from kvferry.kernels.triton_batch_gemm import streams_faster

    generator = _generator(n + k + rows)
    x = random_tensor((rows, k), dtype, generator, CUDA)
    weight = (random_tensor((n, k), dtype, generator, CUDA) * 0.02).to(dtype)
    assert streams_faster(x, weight)
    got = kernels.linear(x, weight)
    want = torch.nn.functional.linear(x.float(), weight.float())
    assert got.dtype == dtype and got.shape == (rows, n)
    torch.testing.assert_close(got.float(), want, atol=2e-3 * float(want.abs().max()), rtol=ONE_ULP[dtype]["rtol"])
