"""Paged decode and prefill attention in Triton against the torch reference, under the interpreter."""

from __future__ import annotations

import pytest
import torch
from interpreted_kernels.cases import ATTENTION_TOLERANCE, DTYPES, paged_kv, poisoned, random_tensor

from kvferry.kernels import reference
from kvferry.kernels.triton_decode_attention import paged_decode_attention
from kvferry.kernels.triton_prefill_attention import PrefillTiling, paged_prefill_attention

# GQA ratios 1, 4, 8, each with head dims 64 and 128; 8 query heads throughout, so 8, 2 or 1 kv heads.
SHAPES = [(1, 64), (1, 128), (4, 64), (4, 128), (8, 64), (8, 128)]
Q_HEADS = 8
# Context lengths off the block size; 300 spans several 64-token tiles and, with 3 spans, three splits.
DECODE_LENGTHS = [1, 17, 45, 300]
# (cached tokens, new tokens) per sequence: fresh prompts, extensions over a cached prefix, single tokens.
PREFILL_SEQS = [(0, 1), (0, 21), (19, 12), (40, 9), (5, 1)]
SMALL_TILING = PrefillTiling(block_m=16, block_n=16, num_warps=4, num_stages=1)
# Block ids above 65535, in a pool of 2-token blocks so that it stays small: their offsets must not wrap.
HIGH_BLOCK_IDS = {"block_size": 2, "lowest_block_id": 65536}


def check_decode(dtype, group, head_dim, seed, splits, block_size=16, lowest_block_id=1, q_heads=Q_HEADS):
    generator = torch.Generator().manual_seed(seed)
    kv = paged_kv(DECODE_LENGTHS, q_heads // group, head_dim, block_size, dtype, generator,
                  lowest_block_id=lowest_block_id)  # fmt: skip
    query = random_tensor((len(DECODE_LENGTHS), q_heads, head_dim), dtype, generator)
    args = (kv.block_tables, kv.context_lens, head_dim**-0.5)
    want = reference.paged_decode_attention(query.float(), *kv.reference_caches(), *args)
    for num_splits in splits:
        out = poisoned(query.shape, dtype)
        paged_decode_attention(query, kv.key_cache, kv.value_cache, *args, out=out, num_splits=num_splits)
        torch.testing.assert_close(out.float(), want, **ATTENTION_TOLERANCE[dtype],
                                   msg=lambda m, n=num_splits: f"{n} splits: {m}")  # fmt: skip
    return kv


def check_prefill(dtype, group, head_dim, seed, tilings, block_size=16, lowest_block_id=1):
    generator = torch.Generator().manual_seed(seed)
    lengths = [cached + new for cached, new in PREFILL_SEQS]
    kv = paged_kv(lengths, Q_HEADS // group, head_dim, block_size, dtype, generator, lowest_block_id=lowest_block_id)
    starts = torch.tensor([0] + [new for _, new in PREFILL_SEQS]).cumsum(0)
    query = random_tensor((int(starts[-1]), Q_HEADS, head_dim), dtype, generator)
    args = (kv.block_tables, kv.context_lens, starts, head_dim**-0.5)
    want = reference.paged_prefill_attention(query.float(), *kv.reference_caches(), *args)
    for tiling in tilings:
        out = poisoned(query.shape, dtype)
        paged_prefill_attention(query, kv.key_cache, kv.value_cache, *args, out=out, tiling=tiling)
        torch.testing.assert_close(out.float(), want, **ATTENTION_TOLERANCE[dtype],
                                   msg=lambda m, t=tiling: f"tiling {t}: {m}")  # fmt: skip
    return kv


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group,head_dim", SHAPES)
def test_decode_matches_reference_with_and_without_splits(dtype, group, head_dim):
    check_decode(dtype, group, head_dim, seed=group * head_dim, splits=(1, 3))


def test_decode_merges_a_group_of_8_over_32_spans():
    # Most of the 32 spans are empty, and the merge takes the group's 8 heads in two loads of 4.
    check_decode(torch.float32, 8, 64, seed=832, splits=(32,))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_with_a_group_off_a_power_of_two(dtype):
    # 6 query heads over 2 kv heads (Qwen2-7B has 7 per kv head): the merge pads the group to 4 members.
    check_decode(dtype, 3, 64, seed=3, splits=(1, 3), q_heads=6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group,head_dim", SHAPES)
def test_prefill_over_cached_prefix_matches_reference(dtype, group, head_dim):
    # The default tiling puts each sequence in one or two tiles; the small one spreads them over several and
    # exercises the tile-to-sequence search, which no dtype changes, so it runs in one dtype (the
    # interpreter is slow).
    tilings = (None, SMALL_TILING) if dtype == torch.bfloat16 else (None,)
    check_prefill(dtype, group, head_dim, seed=group + head_dim, tilings=tilings)


def test_decode_reads_block_ids_above_65535():
    kv = check_decode(torch.bfloat16, 8, 64, seed=3, splits=(2,), **HIGH_BLOCK_IDS)
    assert int(kv.block_tables[kv.block_tables > 0].min()) >= 65536


def test_prefill_reads_block_ids_above_65535():
    kv = check_prefill(torch.bfloat16, 8, 64, seed=4, tilings=(SMALL_TILING,), **HIGH_BLOCK_IDS)
    assert int(kv.block_tables[kv.block_tables > 0].min()) >= 65536
