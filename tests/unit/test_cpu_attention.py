"""The C bfloat16 decode attention (kernels/_cpu_attention.c) against the torch reference it replaces on the
CPU, on strided pool views with random block placement: the same result but for the order of float32 sums,
a row's output the same alone and in any batch, bad tables refused before anything is read, and dispatch's
choice of it."""

from __future__ import annotations

import pytest
import torch

from kvferry.kernels import cpu_attention, reference
from kvferry.kernels import dispatch as kernels

BLOCK_SIZE = 16


def _case(lengths: list[int], num_kv_heads: int, group: int, head_dim: int, seed: int):
    """A bfloat16 pool [blocks, 2 (K, V), block_size, kv_heads, dim] whose per-layer views are strided as the
    engine's, each sequence's blocks at random places, its table padded with the null block 0."""
    generator = torch.Generator().manual_seed(seed)
    counts = [-(-n // BLOCK_SIZE) for n in lengths]
    num_blocks = sum(counts) + 3
    pool = torch.randn(num_blocks, 2, BLOCK_SIZE, num_kv_heads, head_dim, generator=generator).bfloat16()
    order = (torch.randperm(num_blocks - 1, generator=generator) + 1).tolist()
    tables = [order[sum(counts[:i]) : sum(counts[: i + 1])] + [0] * (max(counts) - counts[i]) for i in range(len(lengths))]
    query = torch.randn(len(lengths), num_kv_heads * group, head_dim, generator=generator).bfloat16()
    return query, pool[:, 0], pool[:, 1], torch.tensor(tables), torch.tensor(lengths)


@pytest.mark.parametrize(("lengths", "num_kv_heads", "group", "head_dim"), [
    ([1], 1, 1, 64), ([190], 3, 3, 64), ([1, 17, 40, 3, 16], 2, 4, 128), ([33, 300], 4, 8, 32),
])  # fmt: skip
def test_the_c_kernel_equals_the_reference_but_for_rounding(lengths, num_kv_heads, group, head_dim):
    query, key_cache, value_cache, tables, lens = _case(lengths, num_kv_heads, group, head_dim, seed=len(lengths))
    assert cpu_attention.applies(query, key_cache)
    out = cpu_attention.paged_decode_attention(query, key_cache, value_cache, tables, lens, head_dim**-0.5)
    want = reference.paged_decode_attention(query, key_cache, value_cache, tables, lens, head_dim**-0.5)
    assert out.dtype == torch.bfloat16 and out.shape == want.shape
    # Both compute in float32 and round once to bfloat16: at most one bfloat16 step apart (2^-8 relative).
    torch.testing.assert_close(out.float(), want.float(), rtol=2**-7, atol=1e-3)
    assert (out == want).float().mean() > 0.9  # mostly the very same bits


def test_a_sequence_s_output_is_the_same_alone_and_in_a_batch():
    query, key_cache, value_cache, tables, lens = _case([5, 70, 33], 3, 3, 64, seed=7)
    batched = cpu_attention.paged_decode_attention(query, key_cache, value_cache, tables, lens, 0.125)
    for i in range(3):
        alone = cpu_attention.paged_decode_attention(query[i : i + 1], key_cache, value_cache, tables[i : i + 1],
                                                     lens[i : i + 1], 0.125)  # fmt: skip
        assert torch.equal(alone, batched[i : i + 1])


def test_bad_tables_are_refused_before_anything_is_read():
    query, key_cache, value_cache, tables, lens = _case([20, 40], 2, 2, 64, seed=3)
    outside = tables.clone()
    outside[1, 2] = key_cache.shape[0]  # one past the pool's last block
    with pytest.raises(ValueError, match="a block id outside the pool"):
        cpu_attention.paged_decode_attention(query, key_cache, value_cache, outside, lens, 0.125)
    with pytest.raises(ValueError, match="a context longer than its block table"):
        cpu_attention.paged_decode_attention(query, key_cache, value_cache, tables, lens + 64, 0.125)


def test_dispatch_takes_it_for_bfloat16_on_the_cpu_unless_told_torch(monkeypatch):
    query, key_cache, value_cache, tables, lens = _case([1, 17, 40, 3, 16], 2, 4, 128, seed=5)
    args = (query, key_cache, value_cache, tables, lens, 0.1)
    native, torch_side = cpu_attention.paged_decode_attention(*args), reference.paged_decode_attention(*args)
    assert not torch.equal(native, torch_side)  # else this test could not tell them apart
    assert torch.equal(kernels.paged_decode_attention(*args), native)
    monkeypatch.setenv(kernels.BACKEND_VARIABLE, "torch")
    assert torch.equal(kernels.paged_decode_attention(*args), torch_side)
    assert not cpu_attention.applies(query.float(), key_cache.float())  # float32 keeps SDPA
