"""Linear layers with int8 weights on the CPU: one int8 value per weight, one float32 scale per output row,
multiplied by fbgemm's int8 GEMM (`quantized::linear_dynamic`) against activations quantized as it goes.

Why: a CPU decode step streams every weight once, and float32 weights are 4 bytes each. fbgemm's AVX2 int8
kernel reads a quarter of the bytes. A first probe of the real model's shapes at one row, on the 2-core
development machine while other tests ran (so rough), put `linear` below at 1.7-1.9x the prepacked float32
path for gate/up and down and 6.6x for the LM head, but at half its speed for o_proj, where the ~50 us of
fixed cost per call (the activations' split, fbgemm's own quantization) outweighs the bytes saved.

Activations: `linear_dynamic` quantizes its whole input to 7 bits (fbgemm's reduced range on AVX2) with
one range, so a row's rounding would depend on the other rows of its batch, and 7 bits over a row whose
largest value is an outlier channel cost the real model a fifth of its greedy tokens (80% teacher-forced
top-1 against float32). `linear` below fixes the range and gives each row about 13 bits in two rows.

torch marks its quantized tensor API as deprecated (pytorch#184982); it is what reaches fbgemm from
Python today, and its one use is here.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import torch

INT8_MAX = 127
# A row of zeros would get scale 0; any positive scale represents it exactly.
_SMALLEST_SCALE = 1e-12


@dataclass(frozen=True)
class Int8Weight:
    packed: torch.ScriptObject  # fbgemm's prepacked int8 weight, read by quantized::linear_dynamic
    shape: torch.Size  # [out_features, in_features]

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in `dtype`, int8 values times their row's scale: the reference the GEMM is checked
        against."""
        weight, _ = torch.ops.quantized.linear_unpack(self.packed)
        return weight.dequantize().to(dtype)


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Each row by its largest magnitude (symmetric, zero point 0), packed for fbgemm once."""
    if weight.dim() != 2 or weight.device.type != "cpu":
        raise ValueError(f"int8 weights are 2-d CPU tensors, got {tuple(weight.shape)} on {weight.device}")
    rows = weight.to(torch.float32)
    scale = (rows.abs().amax(dim=1) / INT8_MAX).clamp(min=_SMALLEST_SCALE).double()
    zero_points = torch.zeros(rows.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # the deprecation notice above, once per process otherwise
        warnings.simplefilter("ignore", UserWarning)
        quantized = torch.quantize_per_channel(rows, scale, zero_points, 0, torch.qint8)
    return Int8Weight(packed=torch.ops.quantized.linear_prepack(quantized, None), shape=weight.shape)


# fbgemm takes its activations' range from the whole input: an anchor row holding -1 and 63/64 makes it
# exactly [-1, 63/64], so its 7-bit grid (reduced range on AVX2) is k/64, k in [-64, 63], scale 1/64 and zero
# point 64, whatever the other rows hold.
_GRID = 64
_TOP = 63 / 64  # rows are scaled into [-_TOP, _TOP]: the grid's ends without its lone -1
_FINE = 2 * _GRID * _TOP  # the remainder's scale: half a grid step brought to the grid's full span


def linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """x [rows, in_features] (any float type; computed in float32) times the int8 weight, in x's dtype.

    Each row is scaled by its own largest magnitude into [-63/64, 63/64] and split into a coarse row on the
    grid and its remainder, scaled up to the grid's span and put on it too: 7 bits each, about 13 together, and
    the two rows go through one GEMM, which reads the weights once either way. A row's result is the same
    alone or in any batch, since nothing in it depends on the other rows."""
    if x.device.type != "cpu":
        raise ValueError(f"int8 weights run on the CPU only, got activations on {x.device}")
    rows = x.reshape(-1, x.shape[-1]).to(torch.float32)
    count, width = rows.shape
    # Grid units: each row times _GRID * _TOP / its largest magnitude, in [-63, 63].
    per_unit = rows.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny) / (_GRID * _TOP)
    units = rows / per_unit
    coarse = torch.round(units)
    fine = torch.round((units - coarse).mul_(_FINE))  # |units - coarse| <= 1/2, so fine is in [-63, 63] too
    grid = torch.cat([coarse, fine, _anchor(width)]).mul_(1 / _GRID)
    both = torch.ops.quantized.linear_dynamic(grid, weight.packed, True)
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
