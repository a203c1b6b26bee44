"""A few rows (a decode batch) times an FP8 weight in Triton: out = x @ (data * scale[:, None]).T.

Weight-only FP8: each weight tile is read once from memory as FP8, widened to x's 16-bit type in
registers and multiplied on the tensor cores against the 16-bit activations, so the step reads half
the bytes of bf16 weights and the activations keep their precision. A decode batch is memory-bound:
the grid is cut along N (and along K where N alone gives too few programs to fill the GPU), never along
M, so every weight byte is read once per step whatever the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvferry.kernels.triton_attention_common import device_multiprocessors


@dataclass(frozen=True)
class Fp8GemmTiling:
    block_n: int = 64
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 4
    integer_widening: bool = True  # the word kernel below in place of Triton's conversion


@triton.jit
def _fp8_gemm_kernel(x_ptr, w_ptr, scale_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om, k_per_split,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):  # fmt: skip
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


# float16 or bf16 bits of an e4m3 byte in bits 24-31 of an int32 after an arithmetic shift right by 17 (float16)
# or 20 (bf16): the sign, and the 7 bits of exponent and mantissa at the bottom of the 16-bit exponent and the
# top of its mantissa: e4m3 times 2^-8 as float16, times 2^-120 as bf16 (kernels/triton_fp8_gemv.py explains).
_FP16_BITS = tl.constexpr(0xBF80)
_BF16_BITS = tl.constexpr(0x87F0)
# bf16 x gets 60 added to its exponent (x * 2^60, exact; a zero becomes 2^-67) so that its products with
# 2^-120-scaled weights stay in float32's normal range; float16 x is taken as it is.
_BF16_X_EXPONENT = tl.constexpr(60 << 7)


@triton.jit
def _widened_word_byte(words, byte: tl.constexpr, dtype: tl.constexpr):
    top = words << (24 - 8 * byte)
    if dtype == tl.bfloat16:
        bits = (top >> 20) & _BF16_BITS
    else:
        bits = (top >> 17) & _FP16_BITS
    return bits.to(tl.int16).to(dtype, bitcast=True)


@triton.jit
def _fp8_gemm_words_kernel(x_ptr, words_ptr, scale_ptr, out_ptr, M, N, K_WORDS, stride_xm, stride_wn, stride_om,
                           words_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
                           SPLIT_K: tl.constexpr):  # fmt: skip
    """The kernel above over int32 words of four e4m3 values, widened with integer shifts and masks rather
    than conversions: four dots per tile, one per byte of the words against every fourth column of x."""
    pid_n, split = tl.program_id(0), tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ws = tl.arange(0, BLOCK_W)
    row_mask, col_mask = rows < M, cols < N
    xs = tl.arange(0, 4 * BLOCK_W)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + xs[None, :]
    w_ptrs = words_ptr + cols[:, None].to(tl.int64) * stride_wn + ws[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    dtype = x_ptr.dtype.element_ty
    start = split * words_per_split
    for k in range(start, tl.minimum(start + words_per_split, K_WORDS), BLOCK_W):
        k_mask = k + ws < K_WORDS
        words = tl.load(w_ptrs + k, mask=col_mask[:, None] & k_mask[None, :], other=0)
        x = tl.load(x_ptrs + 4 * k, mask=row_mask[:, None] & (4 * k + xs < 4 * K_WORDS)[None, :], other=0.0)
        if dtype == tl.bfloat16:
            x = (x.to(tl.int16, bitcast=True) + _BF16_X_EXPONENT).to(tl.int16).to(tl.bfloat16, bitcast=True)
        # x's columns 4j + 2a + b: split on b, then on a, gives byte 2a + b of every word.
        even, odd = tl.split(tl.reshape(x, [BLOCK_M, BLOCK_W, 2, 2]))
        x0, x2 = tl.split(even)
        x1, x3 = tl.split(odd)
        acc = tl.dot(x0, tl.trans(_widened_word_byte(words, 0, dtype)), acc)
        acc = tl.dot(x1, tl.trans(_widened_word_byte(words, 1, dtype)), acc)
        acc = tl.dot(x2, tl.trans(_widened_word_byte(words, 2, dtype)), acc)
        acc = tl.dot(x3, tl.trans(_widened_word_byte(words, 3, dtype)), acc)
    if dtype == tl.bfloat16:
        acc *= 2.0**60
    else:
        acc *= 2.0**8
    acc *= tl.load(scale_ptr + cols, mask=col_mask, other=0.0)[None, :]
    out_ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :]
    mask = row_mask[:, None] & col_mask[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(out_ptrs, acc, mask=mask, sem="relaxed")


def fp8_gemm(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor,
             tiling: Fp8GemmTiling = Fp8GemmTiling()) -> torch.Tensor:  # fmt: skip
    """x [M, K] (16-bit, M at most 64) times data [N, K] (FP8, rows contiguous; K a multiple of 4 when widened
    in integers) scaled by scale [N] -> [M, N] in x's dtype."""
    m, k = x.shape
    n = data.shape[0]
    if m > 64 or data.shape[1] != k or data.stride(1) != 1 or (tiling.integer_widening and k % 4):
        raise ValueError(f"fp8_gemm takes x [<=64, {data.shape[1]}] and FP8 rows (of a multiple of 4 values to "
                         f"widen in integers), got {tuple(x.shape)}")
    x = x.contiguous()
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
    if tiling.integer_widening:
        words = data.view(torch.int32)
        _fp8_gemm_words_kernel[(programs_n, split_k)](x, words, scale, out, m, n, k // 4, x.stride(0), words.stride(0),
                                                      out.stride(0), k_per_split // 4, BLOCK_M=block_m,
                                                      BLOCK_N=tiling.block_n, BLOCK_W=tiling.block_k // 4,
                                                      SPLIT_K=split_k, num_warps=tiling.num_warps,
                                                      num_stages=tiling.num_stages)  # fmt: skip
    else:
        _fp8_gemm_kernel[(programs_n, split_k)](x, data, scale, out, m, n, k, x.stride(0), data.stride(0), out.stride(0),
                                                k_per_split, BLOCK_M=block_m, BLOCK_N=tiling.block_n,
                                                BLOCK_K=tiling.block_k, SPLIT_K=split_k, num_warps=tiling.num_warps,
                                                num_stages=tiling.num_stages)  # fmt: skip
    return out if split_k == 1 else out.to(x.dtype)
