"""The FP8 kernels under the interpreter: the one-row GEMV that widens e4m3 with integer operations
(kernels/triton_fp8_gemv.py) reads every byte value exactly, and it and the weight-only GEMM
(kernels/triton_batch_gemm.py) match the dequantized weight in float32, in whole and ragged tiles, for both
16-bit activation types."""

from __future__ import annotations

import pytest
import torch
from interpreted_kernels.cases import random_tensor

from kvferry.kernels.fp8_weight import FP8_DTYPE, quantize_fp8
from kvferry.kernels.triton_batch_gemm import batch_gemm
from kvferry.kernels.triton_fp8_gemv import fp8_gemv


def _every_finite_e4m3() -> torch.Tensor:
    values = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE)
    return values[~values.float().isnan()]  # 254 values: e4m3fn's two NaN bytes are never written


def test_the_gemv_reads_every_finite_e4m3_byte_exactly():
    """Subnormals, both zeros and ±448 included: row j of this weight is byte j, everywhere else zero, so
    x = ones reads each byte alone."""
    values = _every_finite_e4m3()
    width = 4 * ((values.numel() + 3) // 4)
    data = torch.zeros(values.numel(), width, dtype=torch.uint8).view(FP8_DTYPE)
    data[torch.arange(values.numel()), torch.arange(values.numel())] = values
    got = fp8_gemv(torch.ones(1, width), data, torch.ones(values.numel()))
    assert torch.equal(got[0], values.float())


def _weight_and_x(n: int, k: int, rows: int, dtype: torch.dtype, seed: int):
    generator = torch.Generator().manual_seed(seed)
    # Rows a thousand times apart in size: each row's own scale is what brings them back.
    weight = quantize_fp8(random_tensor((n, k), torch.float32, generator) * torch.logspace(-2, 1, n)[:, None])
    x = random_tensor((rows, k), dtype, generator)
    return weight, x, torch.nn.functional.linear(x.float(), weight.dequantize(torch.float32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("n", "k"), [(13, 4096), (7, 300)])  # K in whole 2048-wide tiles, and ragged
def test_the_gemv_matches_the_dequantized_weight(dtype, n, k):
    weight, x, want = _weight_and_x(n, k, 1, dtype, seed=31)
    got = fp8_gemv(x, weight.data, weight.scale)
    assert got.dtype == dtype and got.shape == (1, n)
    torch.testing.assert_close(got.float(), want, atol=1e-2 * float(want.abs().max()), rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("rows", "n", "k"), [(3, 70, 1040), (33, 64, 256)])  # ragged K and N, and whole tiles
def test_the_gemm_matches_the_dequantized_weight(dtype, rows, n, k):
    weight, x, want = _weight_and_x(n, k, rows, dtype, seed=32)
    got = batch_gemm(x, weight.data, weight.scale)
    assert got.dtype == dtype and got.shape == (rows, n)
    torch.testing.assert_close(got.float(), want, atol=1e-2 * float(want.abs().max()), rtol=1e-2)


def test_the_gemv_refuses_a_width_not_a_multiple_of_4():
    weight, x, _ = _weight_and_x(4, 10, 1, torch.bfloat16, seed=33)
    with pytest.raises(ValueError, match="multiple of 4"):
        fp8_gemv(x, weight.data, weight.scale)
