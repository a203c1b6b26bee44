"""A linear layer over an FP8 weight (kernels/fp8_weight.py), by where it runs and how many rows it has.

- Off CUDA, or with `KVFERRY_KERNELS=torch`: the weight dequantized to x's type, then F.linear. Slow, and
  the reference the fast paths are checked against.
- One row (batch-1 decode): the Triton GEMV of kernels/triton_fp8_gemv.py, widening the FP8 bytes with integer
  operations, its per-row scales applied once per output.
- Up to triton_batch_gemm.MAX_ROWS rows (decode batches): the weight-only Triton GEMM
  (kernels/triton_batch_gemm.py), which streams each weight byte once and keeps the activations in 16 bits.
  The GEMV reads the weight as int32 words of four values: an in_features that is not a multiple of 4 (no
  model has one) takes the GEMM instead.
- More rows (prefill): cuBLAS's FP8 GEMM (`torch._scaled_mm`) on activations quantized per token, where the
  tensor cores' FP8 rate, twice bf16's, is what counts (bf16 activations; float16 ones dequantize).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvferry.kernels.fp8_weight import Fp8Weight, quantize_rows


def linear(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None, use_triton: bool) -> torch.Tensor:
    if not use_triton or x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float16):
        return F.linear(x, weight.dequantize(x.dtype), bias)
    from kvferry.kernels import (  # here: Triton is imported for the GPU only
        triton_batch_gemm,
        triton_fp8_gemv,
    )

    if x.shape[0] == 1 and x.shape[1] % 4 == 0:
        out = triton_fp8_gemv.fp8_gemv(x, weight.data, weight.scale)
    elif x.shape[0] <= triton_batch_gemm.MAX_ROWS:
        out = triton_batch_gemm.batch_gemm(x, weight.data, weight.scale)
    elif x.dtype == torch.bfloat16 and x.shape[1] % 16 == 0 and weight.shape[0] % 16 == 0:
        out = scaled_mm(x, weight)
    else:  # cuBLAS's row-scaled FP8 GEMM writes bf16 only, and takes sizes in multiples of 16
        out = F.linear(x, weight.dequantize(x.dtype))
    return out if bias is None else out + bias


def scaled_mm(x: torch.Tensor, weight: Fp8Weight) -> torch.Tensor:
    """cuBLAS's FP8 GEMM with a scale per activation row and per weight row."""
    x_fp8, x_scale = quantize_rows(x)
    return torch._scaled_mm(x_fp8, weight.data.t(), scale_a=x_scale[:, None], scale_b=weight.scale[None, :],
                            out_dtype=x.dtype)  # fmt: skip

