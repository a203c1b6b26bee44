"""The C decode-step kernels (kernels/_cpu_decode.c), float32 and bfloat16, against the torch reference they
replace on the CPU: decode attention on strided pool views with random block placement (the same but for the
order of float32 sums, a row's output the same alone, in any batch and on any thread count), RMSNorm, RoPE
with the KV store (bit for bit), SiLU-and-mul; bad tables, positions and slots refused before anything is
read or written; and dispatch's choice of them."""

from __future__ import annotations

import pytest
import torch

from kvferry.kernels import cpu_decode, reference
from kvferry.kernels import dispatch as kernels

BLOCK_SIZE = 16
DTYPES = [torch.float32, torch.bfloat16]


def _case(lengths: list[int], num_kv_heads: int, group: int, head_dim: int, seed: int, dtype=torch.bfloat16):
    """A pool [blocks, 2 (K, V), block_size, kv_heads, dim] whose per-layer views are strided as the engine's,
    each sequence's blocks at random places, its table padded with the null block 0."""
    generator = torch.Generator().manual_seed(seed)
    counts = [-(-n // BLOCK_SIZE) for n in lengths]
    num_blocks = sum(counts) + 3
    pool = torch.randn(num_blocks, 2, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator).to(dtype)
    order = (torch.randperm(num_blocks - 1, generator=generator) + 1).tolist()
    tables = [order[sum(counts[:i]) : sum(counts[: i + 1])] + [0] * (max(counts) - counts[i]) for i in range(len(lengths))]
    query = torch.randn(len(lengths), num_kv_heads * group, head_dim, generator=generator).to(dtype)
    return query, pool[:, 0], pool[:, 1], torch.tensor(tables), torch.tensor(lengths)


@pytest.mark.parametrize(("lengths", "num_kv_heads", "group", "head_dim"), [
    ([1], 1, 1, 64), ([190], 3, 3, 64), ([1, 17, 40, 3, 16], 2, 4, 128), ([33, 300], 4, 8, 32),
])  # fmt: skip
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_c_kernel_equals_the_reference_but_for_rounding(lengths, num_kv_heads, group, head_dim, dtype):
    query, key_cache, value_cache, tables, lens = _case(lengths, num_kv_heads, group, head_dim, len(lengths), dtype)
    assert cpu_decode.attention_applies(query, key_cache)
    out = cpu_decode.paged_decode_attention(query, key_cache, value_cache, tables, lens, head_dim**-0.5)
    want = reference.paged_decode_attention(query, key_cache, value_cache, tables, lens, head_dim**-0.5)
    assert out.dtype == dtype and out.shape == want.shape
    if dtype == torch.bfloat16:
        # Both compute in float32 and round once to bfloat16: at most one bfloat16 step apart (2^-8 relative).
        torch.testing.assert_close(out.float(), want.float(), rtol=2**-7, atol=1e-3)
        assert (out == want).float().mean() > 0.9  # mostly the very same bits
    else:  # float32 sums in another order than SDPA's: float32's last bits
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_sequence_s_output_is_the_same_alone_and_in_a_batch(dtype):
    query, key_cache, value_cache, tables, lens = _case([5, 70, 33], 3, 3, 64, 7, dtype)
    batched = cpu_decode.paged_decode_attention(query, key_cache, value_cache, tables, lens, 0.125)
    for i in range(3):
        alone = cpu_decode.paged_decode_attention(query[i : i + 1], key_cache, value_cache, tables[i : i + 1],
                                                     lens[i : i + 1], 0.125)  # fmt: skip
        assert torch.equal(alone, batched[i : i + 1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_attention_on_any_thread_count_gives_the_same_bits(threads, dtype):
    query, key_cache, value_cache, tables, lens = _case([5, 70, 33, 1, 200], 3, 3, 64, 11, dtype)
    args = (query, key_cache, value_cache, tables, lens, 0.125)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_decode.paged_decode_attention(*args)
        torch.set_num_threads(threads)  # the kernel splits its (sequence, kv head) pairs over torch's threads
        assert torch.equal(cpu_decode.paged_decode_attention(*args), one)
    finally:
        torch.set_num_threads(before)


def test_bad_tables_are_refused_before_anything_is_read():
    query, key_cache, value_cache, tables, lens = _case([20, 40], 2, 2, 64, seed=3)
    outside = tables.clone()
    outside[1, 2] = key_cache.shape[0]  # one past the pool's last block
    with pytest.raises(ValueError, match="a block id outside the pool"):
        cpu_decode.paged_decode_attention(query, key_cache, value_cache, outside, lens, 0.125)
    with pytest.raises(ValueError, match="a context longer than its block table"):
        cpu_decode.paged_decode_attention(query, key_cache, value_cache, tables, lens + 64, 0.125)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dispatch_takes_the_c_attention_on_the_cpu_unless_told_torch(monkeypatch, dtype):
    query, key_cache, value_cache, tables, lens = _case([1, 17, 40, 3, 16], 2, 4, 128, 5, dtype)
    args = (query, key_cache, value_cache, tables, lens, 0.1)
    native, torch_side = cpu_decode.paged_decode_attention(*args), reference.paged_decode_attention(*args)
    assert not torch.equal(native, torch_side)  # else this test could not tell them apart
    assert torch.equal(kernels.paged_decode_attention(*args), native)
    monkeypatch.setenv(kernels.BACKEND_VARIABLE, "torch")
    assert torch.equal(kernels.paged_decode_attention(*args), torch_side)
    assert not cpu_decode.attention_applies(query.half(), key_cache.half())  # float16 keeps the reference


def _steps_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance between the two in their type's representable values (0: the same bits)."""
    bits = a.element_size() * 8
    as_ints = [t.contiguous().view({16: torch.int16, 32: torch.int32}[bits]).long() for t in (a, b)]
    ordered = [torch.where(t < 0, -(2 ** (bits - 1)) - t, t) for t in as_ints]  # sign-magnitude to a monotone order
    return int((ordered[0] - ordered[1]).abs().max())


# How far the norm and SiLU may be from torch's (the most steps apart, the least share of the very same bits):
# bfloat16's rounding absorbs float32's last bits but for a step at a tie; float32 shows them (another order
# of the mean square's sum, another e^x; 2-4 steps and 65-99% the same bits when written).
CLOSE = {torch.bfloat16: (1, 0.95), torch.float32: (8, 0.5)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [True, False])
def test_rms_norm_is_the_reference_but_for_float32_s_last_bits(with_residual, dtype):
    generator = torch.Generator().manual_seed(11)
    x, residual = (torch.randn(5, 576, generator=generator).to(dtype) for _ in range(2))
    weight = (torch.rand(576, generator=generator) + 0.5).to(dtype)
    out, summed = cpu_decode.rms_norm(x, weight, 1e-5, residual if with_residual else None)
    want, want_summed = reference.rms_norm(x, weight, 1e-5, residual if with_residual else None)
    assert torch.equal(summed, want_summed)  # the residual add: bit for bit
    most_steps, least_same = CLOSE[dtype]
    assert _steps_apart(out, want) <= most_steps and (out == want).float().mean() > least_same


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_and_the_kv_store_are_the_reference_bit_for_bit(dtype):
    generator = torch.Generator().manual_seed(12)
    num_q_heads, num_kv_heads, head_dim, tokens = 9, 3, 64, 5
    qkv = torch.randn(tokens, (num_q_heads + 2 * num_kv_heads) * head_dim, generator=generator).to(dtype)
    q, k, v = (part.view(tokens, -1, head_dim) for part in qkv.split((num_q_heads * head_dim, num_kv_heads * head_dim,
                                                                      num_kv_heads * head_dim), dim=-1))  # fmt: skip
    angles = torch.rand(64, 1, head_dim // 2, generator=generator).repeat(1, 1, 2) * 40
    cos_sin = torch.cat((angles.cos(), angles.sin()), dim=1)
    positions, slots = torch.tensor([0, 7, 63, 31, 2]), torch.tensor([16, 17, 63, 5, 40])
    caches = [torch.zeros(4, 2, BLOCK_SIZE, num_kv_heads, head_dim, dtype=dtype) for _ in range(2)]
    native = cpu_decode.apply_rope_and_store_kv(q, k, v, positions, cos_sin, caches[0][:, 0], caches[0][:, 1], slots)
    want = reference.apply_rope_and_store_kv(q, k, v, positions, cos_sin, caches[1][:, 0], caches[1][:, 1], slots)
    assert torch.equal(native, want) and torch.equal(caches[0], caches[1])
    assert caches[0][:, 0].flatten(0, 1)[slots].count_nonzero() > 0  # the slots were written
    with pytest.raises(ValueError, match="a slot outside the pool"):
        cpu_decode.apply_rope_and_store_kv(q, k, v, positions, cos_sin, caches[0][:, 0], caches[0][:, 1], slots + 60)
    with pytest.raises(ValueError, match="a position outside the RoPE table"):
        cpu_decode.apply_rope_and_store_kv(q, k, v, positions + 1, cos_sin, caches[0][:, 0], caches[0][:, 1], slots)
    assert not cpu_decode.rope_applies(q.contiguous(), k, v, caches[0][:, 0])  # a q/k norm's new tensors: reference


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_is_the_reference_but_for_float32_s_last_bits(dtype):
    gate_up = (torch.randn(4, 2 * 1536, generator=torch.Generator().manual_seed(13)) * 4).to(dtype)
    out, want = cpu_decode.silu_and_mul(gate_up), reference.silu_and_mul(gate_up)
    assert out.shape == want.shape == (4, 1536)
    most_steps, least_same = CLOSE[dtype]
    assert _steps_apart(out, want) <= most_steps and (out == want).float().mean() > least_same
