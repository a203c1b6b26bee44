"""The paged torch kernels against dense attention on the same data (random block placement)."""

import pytest
import torch
import torch.nn.functional as F

from kvferry.kernels import dispatch as kernels


def _paged_cache(lengths, num_kv_heads, head_dim, block_size, generator):
    """Scatter each sequence's dense K/V into randomly chosen pool blocks; returns pool, tables, dense."""
    blocks_per_seq = [-(-n // block_size) for n in lengths]
    num_blocks = sum(blocks_per_seq) + 5
    order = torch.randperm(num_blocks - 1, generator=generator) + 1  # block 0 stays the null block
    pool = torch.randn(num_blocks, 2, block_size, num_kv_heads, head_dim, generator=generator)
    tables, dense, used = [], [], 0
    for n, count in zip(lengths, blocks_per_seq, strict=True):
        table = order[used : used + count]
        used += count
        tables.append(table.tolist() + [0] * (max(blocks_per_seq) - count))
        dense.append((pool[table, 0].flatten(0, 1)[:n], pool[table, 1].flatten(0, 1)[:n]))
    return pool, torch.tensor(tables), dense


def _dense_attention(q, k, v, causal_offset):
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).transpose(0, 1)
    v = v.repeat_interleave(group, dim=1).transpose(0, 1)
    q = q.transpose(0, 1)
    mask = torch.arange(k.shape[1])[None, :] <= torch.arange(q.shape[1])[:, None] + causal_offset
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(0, 1)


@pytest.mark.parametrize("group", [1, 4])
def test_decode_attention_matches_dense(group):
    generator = torch.Generator().manual_seed(0)
    lengths = [1, 17, 40, 3]
    pool, tables, dense = _paged_cache(lengths, 2, 16, 16, generator)
    q = torch.randn(len(lengths), 2 * group, 16, generator=generator)
    out = kernels.paged_decode_attention(q, pool[:, 0], pool[:, 1], tables, torch.tensor(lengths), 16**-0.5)
    for i, (k, v) in enumerate(dense):
        want = _dense_attention(q[i : i + 1], k, v, causal_offset=lengths[i] - 1)
        torch.testing.assert_close(out[i : i + 1], want)


def test_prefill_attention_over_cached_prefix_matches_dense():
    generator = torch.Generator().manual_seed(1)
    lengths, new = [20, 33, 5], [4, 33, 1]  # cached prefixes of 16, 0 and 4 tokens
    pool, tables, dense = _paged_cache(lengths, 2, 16, 16, generator)
    q = torch.randn(sum(new), 8, 16, generator=generator)
    starts = torch.tensor([0, 4, 37, 38])
    out = kernels.paged_prefill_attention(q, pool[:, 0], pool[:, 1], tables, torch.tensor(lengths), starts, 16**-0.5)
    for i, (k, v) in enumerate(dense):
        rows = slice(int(starts[i]), int(starts[i + 1]))
        torch.testing.assert_close(out[rows], _dense_attention(q[rows], k, v, causal_offset=lengths[i] - new[i]))


def test_store_kv_writes_the_mapped_slots_only():
    key_cache = torch.zeros(4, 16, 2, 8)
    value_cache = torch.zeros(4, 16, 2, 8)
    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    slots = torch.tensor([16, 17, 63])  # block 1 offsets 0 and 1, block 3 offset 15
    kernels.store_kv(key, value, key_cache, value_cache, slots)
    torch.testing.assert_close(key_cache[1, :2], key[:2])
    torch.testing.assert_close(value_cache[3, 15], value[2])
    assert key_cache.count_nonzero() == key.count_nonzero()


def test_fused_residual_rms_norm_equals_add_then_norm():
    x, residual, weight = torch.randn(5, 32), torch.randn(5, 32), torch.rand(32)
    normed, new_residual = kernels.rms_norm(x, weight, 1e-6, residual)
    torch.testing.assert_close(new_residual, x + residual)
    torch.testing.assert_close(normed, F.rms_norm(x + residual, (32,), weight, 1e-6))
