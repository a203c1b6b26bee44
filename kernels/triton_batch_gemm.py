"""A decode batch (a few rows) times a weight in Triton: out = x @ (weight * scale[:, None]).T.

Weight streaming: a decode batch is memory-bound, so the grid is cut along N (and along K where N alone
gives too few programs to fill the GPU), never along M, and every weight byte is read once per step
whatever the batch. Two weights take it:
- FP8 (weight-only): each tile is read as FP8, widened to x's 16-bit type in registers and multiplied on
  the tensor cores against the 16-bit activations, with a float32 scale per output row. The step reads
  half the bytes of bf16 weights and the activations keep their precision. Widening with integer
  operations, as the one-row GEMV does (kernels/triton_fp8_gemv.py), was tried here too and measured
  slower at 8-32 rows on an H100 (up to 2.2x at 32): splitting x's tile four ways for four dots cost more
  than the conversions it saved.
- 16-bit, for the large layers where it beats cuBLAS (`streams_faster`): in a one-off sweep on an H200 at
  64 rows (2026-12-07: 162 tilings per 8B layer shape, CUDA-graph replays over 1 GiB of weight copies),
  128-wide tiles read the LM head in 255 us against cuBLAS's 324, gate/up 61.5 against 64.1 and down
  (32-wide) 34.0 against 36.1, while cuBLAS kept qkv (15.9 against 16.5) and o_proj was even (11.6 / 11.7).
  Fewer rows were not swept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvferry.kernels import pdl
from kvferry.kernels.pdl import wait_for_predecessor
from kvferry.kernels.triton_attention_common import device_multiprocessors

MAX_ROWS = 64
# 16-bit weights of at least this many elements stream faster here than through cuBLAS (see above): the 8B
# shape's gate/up (117M), down (58.7M) and LM head (525M), not its qkv (25.2M) or o_proj (16.8M).
STREAMED_16BIT_ELEMENTS = 32 << 20


@dataclass(frozen=True)
class GemmTiling:
    block_n: int = 64
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 4
    programs_per_sm: int = 2  # split K until the grid has about this many programs per multiprocessor; 0: never


def fp8_tiling(rows: int) -> GemmTiling:
    """The best FP8 tiling by batch on an H100 (benchmarks/results/gpu_fp8.json): up to 16 rows, narrower
    tiles give the grid more programs."""
    return GemmTiling(block_n=32 if rows <= 16 else 64)


def tiling_16bit(n: int) -> GemmTiling:
    """The H200 sweep's best at 64 rows: 128-wide tiles where N is large (gate/up, the LM head), 32-wide
    with six stages where it is not (down: 128 programs, about one per multiprocessor); no split in either."""
    if n >= 16384:
        return GemmTiling(block_n=128, num_stages=4, programs_per_sm=0)
    return GemmTiling(block_n=32, num_stages=6, programs_per_sm=0)


def streams_faster(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a 16-bit weight of this size, at x's rows, takes this GEMM rather than cuBLAS."""
    return 1 < x.shape[0] <= MAX_ROWS and weight.numel() >= STREAMED_16BIT_ELEMENTS and weight.stride(1) == 1


# M (the batch's rows) is not specialized on: Triton would otherwise compile one variant for M divisible by 16
# and one for the rest at each BLOCK_M, and the CUDA graphs (batches of 2, 4, 8, 16, 32, 48, 64) compile only
# the former at 32 and 64 rows; an eager step of, say, 24 rows (the LM head of a mixed prefill step) would
# compile mid-serving, once per process. The likely cause of a one-off stall at 1024-token prompts x 64 on an
# H100 (2026-12-07: TTFT 1.56 s against 1.01 s in the run without this GEMM the day before, TPOT better);
# with this change the same case ran at 0.91 s (benchmarks/results/gpu_serving.json).
@triton.jit(do_not_specialize=["M"])
def _batch_gemm_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om, k_per_split,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                       SCALED: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
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
    if SCALED:
        acc *= tl.load(scale_ptr + cols, mask=col_mask, other=0.0)[None, :]
    out_ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :]
    mask = row_mask[:, None] & col_mask[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:  # float32 partial sums of K's spans add up in the output
        tl.atomic_add(out_ptrs, acc, mask=mask, sem="relaxed")


def batch_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor | None = None,
               tiling: GemmTiling | None = None) -> torch.Tensor:  # fmt: skip
    """x [M, K] (16-bit, M at most MAX_ROWS) times weight [N, K] (FP8 with `scale` [N] float32, or x's dtype
    without; rows contiguous) -> [M, N] in x's dtype. The tiling by weight and shape unless given."""
    m, k = x.shape
    n = weight.shape[0]
    if m > MAX_ROWS or weight.shape[1] != k or weight.stride(1) != 1:
        raise ValueError(f"batch_gemm takes x [<={MAX_ROWS}, {weight.shape[1]}] and contiguous weight rows, "
                         f"got x {tuple(x.shape)}")
    if scale is None and weight.dtype != x.dtype:
        raise ValueError(f"a {weight.dtype} weight without a scale, for {x.dtype} activations")
    x = x.contiguous()
    tiling = tiling or (fp8_tiling(m) if scale is not None else tiling_16bit(n))
    block_m = max(16, triton.next_power_of_2(m))
    programs_n = triton.cdiv(n, tiling.block_n)
    split_k = 1
    if tiling.programs_per_sm:  # each span a whole number of tiles
        wanted = max(1, tiling.programs_per_sm * device_multiprocessors(x.device) // programs_n)
        split_k = max(1, min(wanted, k // (4 * tiling.block_k)))
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), tiling.block_k) * tiling.block_k
    split_k = triton.cdiv(k, k_per_split)
    if split_k == 1:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    else:
        out = torch.zeros(m, n, dtype=torch.float32, device=x.device)
    use_pdl = pdl.enabled(x)
    _batch_gemm_kernel[(programs_n, split_k)](
        x, weight, scale if scale is not None else weight, out, m, n, k, x.stride(0), weight.stride(0), out.stride(0),
        k_per_split, BLOCK_M=block_m, BLOCK_N=tiling.block_n, BLOCK_K=tiling.block_k, SPLIT_K=split_k,
        SCALED=scale is not None, num_warps=tiling.num_warps, num_stages=tiling.num_stages, PDL=use_pdl,
        launch_pdl=use_pdl,
    )
    return out if split_k == 1 else out.to(x.dtype)
