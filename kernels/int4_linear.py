"""Linear layers with 4-bit weights on the CPU: groups of 32 weights along a row share a scale and a zero (the
layout of llama.cpp's Q4_1), packed two to a byte for torch's CPU int4 matmul (`_weight_int4pack_mm_for_cpu`).

Why: a CPU decode step streams every weight once. This kernel reads an eighth of float32's bytes and runs
at one row (a batch-1 step) straight from the packed weights; on the 2-core development machine, the real
model's linear layers for one token took 4.9 ms against 25.5 ms prepacked float32 and 18.2 ms for the int8
path (a probe, not a benchmark: docs/benchmarks.md has the engine's figures).

The kernel computes in bfloat16: its float32 and float16 entry points are reference loops, 30-50 times slower
on this CPU. Activations of another dtype are rounded to bfloat16 for the product and the result is returned
in their dtype; a model served in int4 runs fastest with `--dtype bfloat16`, which needs no conversion.

Quantization per group of 32: the group's smallest value maps to 0 and its largest to 15 (asymmetric), as
llama.cpp's Q4_1 does, with the scale and zero in bfloat16 where Q4_1 keeps float16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 32
LEVELS = 15  # 4 bits: 0..15
# torch's packing: a row's values are stored two to a byte in tiles of this many columns' worth of k.
_INNER_K_TILES = 1
_ROW_TILE = 16  # the packing takes output rows sixteen at a time
_CENTER = 8  # the kernel reads a weight as (value - 8) * scale + zero


@dataclass(frozen=True)
class Int4Weight:
    packed: torch.Tensor  # uint8 [rows, in_features / 2], torch's CPU int4 layout; rows padded to 16
    scales_and_zeros: torch.Tensor  # bfloat16 [in_features / GROUP, rows, 2]
    shape: torch.Size  # [out_features, in_features]

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in `dtype` as the kernel reads it: the product with the identity."""
        identity = torch.eye(self.shape[1], dtype=torch.bfloat16)
        return _product(identity, self).T.contiguous().to(dtype)


def quantize_int4(weight: torch.Tensor) -> Int4Weight:
    """Each group of 32 along a row from its smallest to its largest value in 16 steps, packed once."""
    if weight.dim() != 2 or weight.device.type != "cpu":
        raise ValueError(f"int4 weights are 2-d CPU tensors, got {tuple(weight.shape)} on {weight.device}")
    if weight.shape[1] % GROUP:
        raise ValueError(f"int4 weights need in_features divisible by {GROUP}, got {tuple(weight.shape)}")
    # The packing takes output rows sixteen at a time: a vocabulary of another size gets rows of zeros,
    # which `linear` leaves out of its result.
    padding = -weight.shape[0] % _ROW_TILE
    rows, cols = weight.shape[0] + padding, weight.shape[1]
    padded = torch.nn.functional.pad(weight.to(torch.float32), (0, 0, 0, padding))
    groups = padded.reshape(rows, cols // GROUP, GROUP)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    # The kernel reads a bfloat16 scale and, as its zero, the value at level 8; both are rounded first and
    # the levels chosen against what the kernel will compute, where level 0 lands after that rounding.
    scale = ((high - low) / LEVELS).to(torch.bfloat16)
    zero = (low + _CENTER * scale.float()).to(torch.bfloat16)
    level_zero = zero.float() - _CENTER * scale.float()
    steps = torch.where(scale > 0, scale.float(), torch.ones_like(low))  # a constant group: all at level 0
    values = torch.round((groups - level_zero[..., None]) / steps[..., None]).clamp(0, LEVELS).to(torch.int32)
    scales_and_zeros = torch.stack((scale.T, zero.T), dim=-1).contiguous()
    packed = torch._convert_weight_to_int4pack_for_cpu(values.reshape(rows, cols), _INNER_K_TILES)
    return Int4Weight(packed=packed, scales_and_zeros=scales_and_zeros, shape=weight.shape)


def linear(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in_features] times the int4 weight (+ bias), in x's dtype; the product in bfloat16. Each row's
    result depends on that row alone."""
    if x.device.type != "cpu":
        raise ValueError(f"int4 weights run on the CPU only, got activations on {x.device}")
    if bias is None and x.dim() == 2 and x.dtype == torch.bfloat16 and x.is_contiguous():
        return _product(x, weight)  # the engine's own case: five no-op calls fewer, a few microseconds each
    rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()  # the kernel reads rows packed
    out = _product(rows, weight).to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _product(rows: torch.Tensor, weight: Int4Weight) -> torch.Tensor:
    out = torch._weight_int4pack_mm_for_cpu(rows, weight.packed, GROUP, weight.scales_and_zeros)
    return out if out.shape[1] == weight.shape[0] else out[:, : weight.shape[0]]
