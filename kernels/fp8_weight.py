"""A linear layer's weight in FP8 (e4m3) with one float32 scale per output row.

`weight ~= data.float() * scale[:, None]`. Per-row scales hold both checkpoint layouts of Hugging Face FP8
models (a per-tensor scale is repeated down the rows; a per-channel one is the rows' own), and they stay
exact when q/k/v or gate/up, each with its own scale, are stacked into one matrix. A decode step reads half
the bytes of bf16 weights; the kernels that read `data` as it is, and where each runs, are in
kernels/fp8_linear.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max  # 448
# A row of zeros would get scale 0 and divide by it; any positive scale represents it exactly.
_SMALLEST_SCALE = 1e-12


@dataclass(frozen=True)
class Fp8Weight:
    data: torch.Tensor  # [out_features, in_features], FP8_DTYPE, rows contiguous
    scale: torch.Tensor  # [out_features], float32

    def __post_init__(self) -> None:
        if self.data.dtype != FP8_DTYPE or self.data.dim() != 2:
            raise ValueError(f"FP8 weight data must be a 2-d {FP8_DTYPE}, got {self.data.dtype} {tuple(self.data.shape)}")
        if self.scale.dtype != torch.float32 or tuple(self.scale.shape) != (self.data.shape[0],):
            raise ValueError(f"FP8 weight scale must be float32 [{self.data.shape[0]}], got "
                             f"{self.scale.dtype} {tuple(self.scale.shape)}")  # fmt: skip

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight in `dtype`: what the CPU path and the reference compute with."""
        return (self.data.to(torch.float32) * self.scale[:, None]).to(dtype)


def quantize_rows(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 values and one float32 scale per row, by absmax: each row's largest magnitude maps to FP8's
    largest finite value. For weights at load, and for activations before an FP8 GEMM."""
    rows = matrix.to(torch.float32)
    scale = (rows.abs().amax(dim=1) / FP8_MAX).clamp(min=_SMALLEST_SCALE)
    return (rows / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def quantize_fp8(weight: torch.Tensor) -> Fp8Weight:
    data, scale = quantize_rows(weight)
    return Fp8Weight(data.contiguous(), scale)


def fp8_from_checkpoint(data: torch.Tensor, scale: torch.Tensor) -> Fp8Weight:
    """A checkpoint's FP8 weight and its `weight_scale`: one value for the tensor ([] or [1]) or one per
    output row ([N] or [N, 1]). Block-wise scales are another format and are refused by the loader."""
    rows = data.shape[0]
    scale = scale.to(device=data.device, dtype=torch.float32).reshape(-1)
    if scale.numel() == 1:
        scale = scale.expand(rows)
    elif scale.numel() != rows:
        raise ValueError(f"an FP8 weight of {rows} rows needs 1 or {rows} scales, got {scale.numel()}")
    return Fp8Weight(data.contiguous(), scale.contiguous())


def stack_fp8(parts: Sequence[Fp8Weight]) -> Fp8Weight:
    """Stack weights by rows (q/k/v, gate/up) with their scales."""
    return Fp8Weight(torch.cat([part.data for part in parts]), torch.cat([part.scale for part in parts]))
