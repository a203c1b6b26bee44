"""One row times an FP8 (e4m3) weight in Triton, for batch-1 decode: out[n] = scale[n] * sum_k x[k] * data[n, k].

Why not the bf16 GEMV (kernels/triton_linear.py) over FP8 loads: Triton widens e4m3 through float16, one
`cvt` per element (and one per two before it), and Hopper issues conversions at a quarter of its integer
rate and an eighth of its FMA rate. On the H200 that GEMV read FP8 at 2.9-3.3 TB/s against bf16's
3.3-4.2: bound by the conversions, not the bytes (benchmarks/results/gpu_fp8.json).

Here each int32 word of the weight holds four e4m3 values, and each is widened with a shift, an arithmetic
shift and a mask into float32 bits: the byte moved to the top, shifted right by 4 with its sign copied, and
bits 27-30 cleared leaves e4m3's sign as float32's sign, its 4 exponent bits as the low bits of float32's
exponent and its 3 mantissa bits as the top of float32's mantissa. That float is the e4m3 value times
2^-120 exactly (the biases are 7 and 127; e4m3's subnormals land on float32's), so no table and no `cvt`.
x is multiplied by 2^60 as it is loaded, keeping every product in float32's normal range, and the output by
2^60 and the row's scale. e4m3fn's NaN pattern would read as 480: quantized weights never hold it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvferry.kernels import pdl
from kvferry.kernels.pdl import wait_for_predecessor
from kvferry.kernels.triton_linear import weight_tile

# The float32 bits of an e4m3 byte after `(byte << 24) >> 4`: the sign, and the 7 bits of exponent and
# mantissa at 20-26 (0x87F00000 as a signed int32).
_WIDENED_BITS = tl.constexpr(-0x78100000)
_X_SCALE = tl.constexpr(2.0**60)  # x's factor; the widened weight's 2^-120 and it leave 2^-60 on each product


@dataclass(frozen=True)
class Fp8GemvTiling:
    block_n: int = 4  # weight rows per program
    max_block_words: int = 512  # int32 words (4 FP8 values each) per row per tile, fewer where K is smaller
    num_warps: int = 4


# Layers of at most this many outputs take eight rows a program. In the two H100 runs of gpu_fp8.json (8B
# shapes, one row) eight rows ran down (4096 x 14336) in 22.0 us against four's 24.5 (23.7 against 25.5 in
# the run before) and o_proj (4096 x 4096) in 7.2 against 8.1 (9.1 against 9.3), while four were 1-11%
# faster for qkv (6144 outputs) and gate/up (28672).
NARROW_OUTPUTS = 4096


def tiling_for(n: int) -> Fp8GemvTiling:
    return Fp8GemvTiling(block_n=8 if n <= NARROW_OUTPUTS else 4)


@triton.jit
def _widen(top_byte):
    """float32 of the e4m3 byte in bits 24-31 of an int32, times 2^-120."""
    return ((top_byte >> 4) & _WIDENED_BITS).to(tl.float32, bitcast=True)


@triton.jit
def _scaled_x(ptrs, mask, EVEN_K: tl.constexpr):
    if EVEN_K:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0)
    return (x.to(tl.float32) * _X_SCALE)[None, :]


@triton.jit
def _accumulate(acc, words, x_ptr, k, K_WORDS, cols, EVEN_K: tl.constexpr):
    """acc plus the four products of each word's FP8 values with x's columns 4j .. 4j+3 (lowest byte first)."""
    col_mask = k + cols < K_WORDS
    x_ptrs = x_ptr + 4 * (k + cols)
    acc += _widen(words << 24) * _scaled_x(x_ptrs, col_mask, EVEN_K)
    acc += _widen(words << 16) * _scaled_x(x_ptrs + 1, col_mask, EVEN_K)
    acc += _widen(words << 8) * _scaled_x(x_ptrs + 2, col_mask, EVEN_K)
    acc += _widen(words) * _scaled_x(x_ptrs + 3, col_mask, EVEN_K)
    return acc


@triton.jit
def _fp8_gemv_kernel(x_ptr, words_ptr, scale_ptr, out_ptr, N, K_WORDS, stride_wn, BLOCK_N: tl.constexpr,
                     BLOCK_W: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    cols = tl.arange(0, BLOCK_W)
    w_ptrs = words_ptr + rows[:, None].to(tl.int64) * stride_wn + cols[None, :]
    # The first tile of words is fetched before x, which the kernel before writes, may be read (kernels/pdl.py).
    words = weight_tile(w_ptrs, 0, K_WORDS, cols, row_mask, EVEN_K)
    wait_for_predecessor(PDL)
    acc = _accumulate(tl.zeros([BLOCK_N, BLOCK_W], dtype=tl.float32), words, x_ptr, 0, K_WORDS, cols, EVEN_K)
    for k in range(BLOCK_W, K_WORDS, BLOCK_W):
        words = weight_tile(w_ptrs, k, K_WORDS, cols, row_mask, EVEN_K)
        acc = _accumulate(acc, words, x_ptr, k, K_WORDS, cols, EVEN_K)
    out = tl.sum(acc, axis=1) * (tl.load(scale_ptr + rows, mask=row_mask, other=0.0) * _X_SCALE)
    tl.store(out_ptr + rows, out.to(out_ptr.dtype.element_ty), mask=row_mask)


def fp8_gemv(x: torch.Tensor, data: torch.Tensor, scale: torch.Tensor,
             tiling: Fp8GemvTiling | None = None) -> torch.Tensor:  # fmt: skip
    """x [1, K] times data [N, K] (FP8, rows contiguous, K a multiple of 4) scaled by scale [N] (float32)
    -> [1, N] in x's dtype; the tiling by N (tiling_for) unless given."""
    n, k = data.shape
    if x.shape != (1, k) or data.stride(1) != 1 or k % 4 or data.stride(0) % 4:
        raise ValueError(f"fp8_gemv takes x [1, {k}] and FP8 rows of a multiple of 4 values, got {tuple(x.shape)}")
    words = data.view(torch.int32)
    x = x.contiguous()
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    k_words = k // 4
    tiling = tiling or tiling_for(n)
    block_w = min(tiling.max_block_words, triton.next_power_of_2(k_words))
    use_pdl = pdl.enabled(x)
    _fp8_gemv_kernel[(triton.cdiv(n, tiling.block_n),)](x, words, scale, out, n, k_words, words.stride(0),
                                                        BLOCK_N=tiling.block_n, BLOCK_W=block_w,
                                                        EVEN_K=k_words % block_w == 0, PDL=use_pdl,
                                                        num_warps=tiling.num_warps, launch_pdl=use_pdl)  # fmt: skip
    return out
