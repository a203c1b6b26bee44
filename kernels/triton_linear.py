"""One-row matmul (a GEMV) in Triton, for batch-1 decode: out[n] = sum_k x[k] * weight[n, k].

One program per BLOCK_N weight rows walks the whole K in BLOCK_K-wide tiles and multiplies in float32
elementwise, reducing once at the end. On an H200 (the probe described in docs/gpu.md, bf16, weights read
once, graph replays) BLOCK_N 4, BLOCK_K 2048 and 4 warps were the best of 18 configurations at every
8B-model shape and read the weights faster than cuBLAS's choice for one row: 3.3-4.5 TB/s against
2.5-4.1 (o_proj 4096 x 4096: 10.3 us against 13.2). Larger batches stay on cuBLAS's tensor-core GEMMs.
FP8 weights have a GEMV of their own (kernels/triton_fp8_gemv.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvferry.kernels import pdl
from kvferry.kernels.pdl import wait_for_predecessor

BLOCK_N = 4
MAX_BLOCK_K = 2048
NUM_WARPS = 4


@dataclass(frozen=True)
class GemvTiling:
    block_n: int = BLOCK_N  # weight rows per program
    max_block_k: int = MAX_BLOCK_K  # columns per tile, fewer where K is smaller
    num_warps: int = NUM_WARPS


@triton.jit
def weight_tile(w_ptrs, k, K, cols, row_mask, EVEN_K: tl.constexpr):
    """Columns k .. k + len(cols) of a program's weight rows, zeros past N and K (the FP8 GEMV's too)."""
    if EVEN_K:
        return tl.load(w_ptrs + k, mask=row_mask[:, None], other=0)
    return tl.load(w_ptrs + k, mask=row_mask[:, None] & (k + cols < K)[None, :], other=0)


@triton.jit
def _x_tile(x_ptr, k, K, cols, EVEN_K: tl.constexpr):
    if EVEN_K:
        return tl.load(x_ptr + k + cols).to(tl.float32)[None, :]
    return tl.load(x_ptr + k + cols, mask=k + cols < K, other=0.0).to(tl.float32)[None, :]


@triton.jit
def _gemv_kernel(x_ptr, weight_ptr, out_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN_K: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    cols = tl.arange(0, BLOCK_K)
    w_ptrs = weight_ptr + rows[:, None].to(tl.int64) * stride_wn + cols[None, :]
    # The first weight tile is fetched before x, which the kernel before writes, may be read (kernels/pdl.py).
    w = weight_tile(w_ptrs, 0, K, cols, row_mask, EVEN_K)
    wait_for_predecessor(PDL)
    acc = w.to(tl.float32) * _x_tile(x_ptr, 0, K, cols, EVEN_K)
    for k in range(BLOCK_K, K, BLOCK_K):
        acc += weight_tile(w_ptrs, k, K, cols, row_mask, EVEN_K).to(tl.float32) * _x_tile(x_ptr, k, K, cols, EVEN_K)
    out = tl.sum(acc, axis=1)
    tl.store(out_ptr + rows, out.to(out_ptr.dtype.element_ty), mask=row_mask)


def gemv(x: torch.Tensor, weight: torch.Tensor, tiling: GemvTiling = GemvTiling()) -> torch.Tensor:
    """x [1, K] @ weight[N, K].T -> [1, N] in x's dtype; weight rows contiguous."""
    n, k = weight.shape
    if x.shape != (1, k) or weight.stride(1) != 1:
        raise ValueError(f"gemv takes x [1, {k}] and a weight with contiguous rows, got {tuple(x.shape)}")
    x = x.contiguous()
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    block_k = min(tiling.max_block_k, triton.next_power_of_2(k))
    use_pdl = pdl.enabled(x)
    _gemv_kernel[(triton.cdiv(n, tiling.block_n),)](x, weight, out, n, k, weight.stride(0), BLOCK_N=tiling.block_n,
                                                    BLOCK_K=block_k, EVEN_K=k % block_k == 0, PDL=use_pdl,
                                                    num_warps=tiling.num_warps, launch_pdl=use_pdl)  # fmt: skip
    return out
