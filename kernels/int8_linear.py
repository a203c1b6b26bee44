"""Linear layers with int8 weights on the CPU: one int8 value per weight, one float32 scale per output row,
multiplied by kvferry's C kernel (kernels/cpu_gemv.py) as llama.cpp multiplies its Q8_0 weights: each row's
activations quantized to int8 in blocks of 32 on their own scale, each block's products an exact integer sum
(AVX-512 VNNI's byte dot products, four products and their sum an instruction), scaled into a float32 total.

Why: a CPU decode step streams every weight once, and int8 reads a quarter of float32's bytes, half of
bfloat16's. Widening each int8 weight to float32 for a float32 FMA (this module's kernel before) made the
products, not the bytes, the bound: 121 calls of SmolLM2's shapes took as long at 16 rows as float32's, and at
one row its bytes streamed at half float32's rate. fbgemm's int8 GEMM (`quantized::linear_dynamic`), used
before that, cost about 50 us a call before any work.

Rows: the C kernel at any count, prefill too. Its weight tiles fit the core's L1, so more rows cost only
products, four an instruction: SmolLM2's four linear shapes at 512 rows took 13 ms where MKL's GEMM on the
weight dequantized once a call took 17 (bfloat16) and 27 (float32), which this module used past 64 bfloat16
rows before VNNI.

Quality: the activations' rounding (half a step of their block's scale, 1/254 of its largest magnitude) is
added to the weights' own (half a step of their row's scale). Blocks of 32 keep an outlier channel from
coarsening the whole row, which one scale a row did: fbgemm's 7-bit activations over each row's span cost the
real model a fifth of its greedy tokens. tests/integration/test_cpu_quantized_weights.py has the agreement
with float32, benchmarks/cpu_real_model.py the agreement with llama.cpp on the same Q8_0 file.

`KVFERRY_KERNELS=torch` keeps fbgemm's path, as kernels/cpu_linear.py keeps oneDNN's for bfloat16 and
float32: torch's own kernels, for comparison and for a CPU where the C kernel would misbehave (its
activations in about 13 bits a row, `_fbgemm_linear`). Its packed copy is made on first use, so a node on the
C kernel holds its weights once. torch marks its quantized tensor API as deprecated (pytorch#184982); it is
what reaches fbgemm from Python today, and its one use is here.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import torch

from kvferry.kernels import cpu_gemv

INT8_MAX = 127
# A row of zeros would get scale 0; any positive scale represents it exactly.
_SMALLEST_SCALE = 1e-12


@dataclass(frozen=True)
class Int8Weight:
    packed: cpu_gemv.PackedWeight  # the int8 values in the C kernel's tiles, with their rows' float32 scales
    shape: torch.Size  # [out_features, in_features]

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in `dtype`, int8 values times their row's scale: the reference the kernels are checked
        against."""
        assert self.packed.scales is not None  # quantize_int8 packs them
        return (cpu_gemv.unpack(self.packed).to(torch.float32) * self.packed.scales[:, None]).to(dtype)

    @functools.cached_property
    def fbgemm(self) -> torch.ScriptObject:
        """fbgemm's prepacked copy of the same values and scales, for `KVFERRY_KERNELS=torch`: made on its
        first call."""
        assert self.packed.scales is not None
        zero_points = torch.zeros(self.shape[0], dtype=torch.long)
        values = cpu_gemv.unpack(self.packed).contiguous()
        with warnings.catch_warnings():  # the deprecation notice above, once per process otherwise
            warnings.simplefilter("ignore", UserWarning)
            quantized = torch._make_per_channel_quantized_tensor(values, self.packed.scales.double(), zero_points, 0)
        return torch.ops.quantized.linear_prepack(quantized, None)


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Each row by its largest magnitude (symmetric, zero point 0), packed for the C kernel once."""
    if weight.dim() != 2 or weight.device.type != "cpu":
        raise ValueError(f"int8 weights are 2-d CPU tensors, got {tuple(weight.shape)} on {weight.device}")
    rows = weight.to(torch.float32)
    scales = (rows.abs().amax(dim=1) / INT8_MAX).clamp(min=_SMALLEST_SCALE)
    values = torch.round(rows / scales[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return Int8Weight(packed=cpu_gemv.pack(values, scales), shape=weight.shape)


def linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None, native: bool) -> torch.Tensor:
    """x [..., in_features] (any float type; bfloat16 and float32 as they are, others in float32) times the
    int8 weight (+ bias), in x's dtype, by the C kernel (`native`, dispatch's choice; the rows quantized in
    blocks, see the top) or fbgemm. A row's result depends on that row alone."""
    if x.device.type != "cpu":
        raise ValueError(f"int8 weights run on the CPU only, got activations on {x.device}")
    if not native:
        return _fbgemm_linear(x, weight, bias)
    rows = x.reshape(-1, x.shape[-1])
    if rows.dtype not in cpu_gemv.DTYPES:
        rows = rows.to(torch.float32)
    if bias is not None and bias.dtype != rows.dtype:
        bias = bias.to(rows.dtype)
    out = cpu_gemv.linear(rows.contiguous(), weight.packed, bias, torch.get_num_threads())
    return out.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


# fbgemm takes its activations' range from the whole input: an anchor row holding -1 and 63/64 makes it
# exactly [-1, 63/64], so its 7-bit grid (reduced range on AVX2) is k/64, k in [-64, 63], scale 1/64 and zero
# point 64, whatever the other rows hold.
_GRID = 64
_TOP = 63 / 64  # rows are scaled into [-_TOP, _TOP]: the grid's ends without its lone -1
_FINE = 2 * _GRID * _TOP  # the remainder's scale: half a grid step brought to the grid's full span


def _fbgemm_linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """fbgemm's product (in float32), its activations quantized to about 13 bits a row.

    Each row is scaled by its own largest magnitude into [-63/64, 63/64] and split into a coarse row on the
    grid and its remainder, scaled up to the grid's span and put on it too: 7 bits each, about 13 together, and
    the two rows go through one GEMM, which reads the weights once either way. A row's result is the same
    alone or in any batch, since nothing in it depends on the other rows."""
    rows = x.reshape(-1, x.shape[-1]).to(torch.float32)
    count, width = rows.shape
    # Grid units: each row times _GRID * _TOP / its largest magnitude, in [-63, 63].
    per_unit = rows.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny) / (_GRID * _TOP)
    units = rows / per_unit
    coarse = torch.round(units)
    fine = torch.round((units - coarse).mul_(_FINE))  # |units - coarse| <= 1/2, so fine is in [-63, 63] too
    grid = torch.cat([coarse, fine, _anchor(width)]).mul_(1 / _GRID)
    both = torch.ops.quantized.linear_dynamic(grid, weight.fbgemm, True)
    out = torch.add(both[:count], both[count : 2 * count], alpha=1 / _FINE).mul_(per_unit * _GRID)
    if bias is not None:
        out = out + bias
    return out.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


@functools.cache
def _anchor(width: int) -> torch.Tensor:
    """The row holding fbgemm's range, in grid units."""
    row = torch.zeros(1, width)
    row[0, 0], row[0, 1] = -_GRID, _GRID * _TOP
    return row
