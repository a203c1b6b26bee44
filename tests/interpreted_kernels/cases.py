"""Random inputs for the kernel tests, shared by the interpreter tests here and the CUDA tests in tests/gpu.

Paged K/V lives in a real multi-layer pool (kvcache.KVPool's layout), so the kernels get the strided
per-layer views the engine gives them. Every pool slot outside a sequence's context holds NaN: a kernel
that reads past a context's end, or through the wrong block, turns its output into NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Attention outputs in float32 against the reference computed in float32 (or float64) from the same inputs.
ATTENTION_TOLERANCE = {
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class PagedKV:
    pool: torch.Tensor  # [num_blocks, num_layers, 2, block_size, kv_heads, head_dim]
    key_cache: torch.Tensor  # pool[:, layer, 0]
    value_cache: torch.Tensor  # pool[:, layer, 1]
    block_tables: torch.Tensor  # [seqs, max_blocks], padded with block 0
    context_lens: torch.Tensor  # [seqs]

    def reference_caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The caches in float32 with NaN zeroed: the reference reads past a short context's end (it
        multiplies those values by a zero probability), the kernels must not."""
        return self.key_cache.float().nan_to_num(0.0), self.value_cache.float().nan_to_num(0.0)


def paged_kv(
    lengths: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    generator: torch.Generator,
    device: str = "cpu",
    num_blocks: int | None = None,
    lowest_block_id: int = 1,
) -> PagedKV:
    """Each sequence's context in distinct random blocks drawn from [lowest_block_id, num_blocks); the
    pool's other layer and every slot past a context's end hold NaN."""
    blocks_per_seq = [-(-n // block_size) for n in lengths]
    num_blocks = num_blocks or lowest_block_id + sum(blocks_per_seq) + 3
    pool = torch.full((num_blocks, 2, 2, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype, device=device)
    chosen = torch.randperm(num_blocks - lowest_block_id, generator=generator)[: sum(blocks_per_seq)] + lowest_block_id
    pool[chosen.to(device), 1] = random_tensor((len(chosen), 2, block_size, num_kv_heads, head_dim), dtype, generator, device)
    tables = torch.zeros(len(lengths), max(blocks_per_seq), dtype=torch.long)
    used = 0
    for seq, (length, count) in enumerate(zip(lengths, blocks_per_seq, strict=True)):
        tables[seq, :count] = chosen[used : used + count]
        used += count
        pool[tables[seq, count - 1], 1, :, length - (count - 1) * block_size :] = float("nan")
    return PagedKV(pool, pool[:, 1, 0], pool[:, 1, 1], tables.to(device), torch.tensor(lengths, device=device))


def random_tensor(
    shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator, device: str = "cpu"
) -> torch.Tensor:
    return torch.randn(shape, generator=generator).to(device=device, dtype=dtype)


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def strided_qkv(
    tokens: int, num_q_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, generator: torch.Generator,
    device: str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as the model makes them: views into one fused qkv projection output (row stride > width)."""
    q_size, kv_size = num_q_heads * head_dim, num_kv_heads * head_dim
    qkv = random_tensor((tokens, q_size + 2 * kv_size), dtype, generator, device)
    q, k, v = qkv.split((q_size, kv_size, kv_size), dim=-1)
    return (
        q.view(tokens, num_q_heads, head_dim),
        k.view(tokens, num_kv_heads, head_dim),
        v.view(tokens, num_kv_heads, head_dim),
    )
