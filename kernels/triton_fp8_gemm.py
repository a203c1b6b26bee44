"""A few rows (a decode batch) times an FP8 weight in Triton: out = x @ (data * scale[:, None]).T.

Weight-only FP8: each weight tile is read once from memory as FP8, widened to x's 16-bit type in
registers and multiplied on the tensor cores against the 16-bit activations, so the step reads half
the bytes of bf16 weights and the activations keep their precision. A decode batch is memory-bound:
the grid is cut along N (and along K where N alone gives too few programs to fill the GPU), never along
M, so every weight byte is read once per step whatever the batch.

Widening with integer operations, as the one-row GEMV does (kernels/triton_fp8_gemv.py), was tried here
too and measured slower at 8-32 rows on an H100 (up to 2.2x at 32): splitting x's tile four ways for four
dots cost more than the conversions it saved.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvferry.kernels import pdl
from kvferry.kernels.pdl import wait_for_predecessor
from kvferry.kernels.triton_attention_common import device_multiprocessors


@dataclass(frozen=True)
class Fp8GemmTiling:
    block_n: int = 64
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 4


def tiling_for(rows: int) -> Fp8GemmTiling:
    """The best tiling by batch on an H100 (benchmarks/results/gpu_fp8.json): up to 16 rows, narrower tiles
    give the grid more programs."""
    return Fp8GemmTiling(block_n=32 if rows <= 16 else 64)


@triton.jit
def _fp8_gemm_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om, k_per_split,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                     PDL: tl.constexpr):  # fmt: skip
    wait_for_predecessor(PDL)
    pid_n, split = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_mask, col_mask = rows < M, cols < N
    x_ptrs = x_ptr + rows[:, None] * stride_xm + ks[None, :]
    w_ptrs = w_ptr + cols[:, None].to(tl.int64) * stride_wn + ks[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    start = split * k_per_split
    for k in range(start, tl.minimum(start + k_per_split, K), BLOCK_K):
        k_mask = k + ks < K
        x = tl.load(x_ptrs + k, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs + k, mask=col_mask[:, None] & k_mask[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc)
    acc *= tl.load(scale_ptr + cols, mask=col_mask, other=0.0)[None, :]
    out_ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :]
    mask = row_mask[:, None] & col_mask[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:  # float32 partial sums of K's spans add up in the output
        tl.atomic_add(out_ptrs, acc, mask=mask, sem="relaxed")


def fp8_gemm(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor,
             tiling: Fp8GemmTiling | None = None) -> torch.Tensor:  # fmt: skip
    """x [M, K] (16-bit, M at most 64) times data [N, K] (FP8, rows contiguous) scaled by scale [N]
    -> [M, N] in x's dtype."""
    m, k = x.shape
    n = data.shape[0]
    if m > 64 or data.shape[1] != k or data.stride(1) != 1:
        raise ValueError(f"fp8_gemm takes x [<=64, {data.shape[1]}] and FP8 rows, got {tuple(x.shape)}")
    x = x.contiguous()
    tiling = tiling or tiling_for(m)
    block_m = max(16, triton.next_power_of_2(m))
    programs_n = triton.cdiv(n, tiling.block_n)
    # Split K until the grid has about two programs per multiprocessor; each span a whole number of tiles.
    wanted = max(1, 2 * device_multiprocessors(x.device) // programs_n)
    split_k = max(1, min(wanted, k // (4 * tiling.block_k)))
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), tiling.block_k) * tiling.block_k
    split_k = triton.cdiv(k, k_per_split)
    if split_k == 1:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    else:
        out = torch.zeros(m, n, dtype=torch.float32, device=x.device)
    use_pdl = pdl.enabled(x)
    _fp8_gemm_kernel[(programs_n, split_k)](x, data, scale, out, m, n, k, x.stride(0), data.stride(0), out.stride(0),
                                            k_per_split, BLOCK_M=block_m, BLOCK_N=tiling.block_n,
                                            BLOCK_K=tiling.block_k, SPLIT_K=split_k, num_warps=tiling.num_warps,
                                            num_stages=tiling.num_stages, PDL=use_pdl, launch_pdl=use_pdl)  # fmt: skip
    return out if split_k == 1 else out.to(x.dtype)
