"""The weight-streaming GEMM for a decode batch (kernels/triton_batch_gemm.py) with a 16-bit weight, under the
interpreter: whole and ragged tiles, with K split across programs and not. float16 only: the interpreter
reads bfloat16 weights wrongly (relative errors of 1e11 where float16 gives 2e-4), which the FP8 path's
widening to bfloat16 does not meet (tests/interpreted_kernels/test_interpreted_fp8.py); on the GPU both
run (tests/gpu/test_cuda_kernels.py)."""

from __future__ import annotations

import pytest
import torch
from interpreted_kernels.cases import random_tensor

from kvferry.kernels.triton_batch_gemm import GemmTiling, batch_gemm


# Ragged K and N, whole tiles, and one program's worth of N: the interpreter counts as one multiprocessor, so
# only that last case splits K (in two) where splitting is allowed.
@pytest.mark.parametrize("programs_per_sm", [0, 2], ids=["whole K", "split K"])
@pytest.mark.parametrize(("rows", "n", "k"), [(3, 70, 1040), (33, 64, 256), (5, 20, 1040)])
def test_the_16_bit_gemm_matches_float32_matmul(programs_per_sm, rows, n, k):
    generator = torch.Generator().manual_seed(rows + n)
    x = random_tensor((rows, k), torch.float16, generator)
    weight = (random_tensor((n, k), torch.float16, generator) * 0.05).to(torch.float16)
    got = batch_gemm(x, weight, tiling=GemmTiling(block_n=32, programs_per_sm=programs_per_sm))
    want = torch.nn.functional.linear(x.float(), weight.float())
    assert got.dtype == torch.float16 and got.shape == (rows, n)
    torch.testing.assert_close(got.float(), want, atol=2e-3 * float(want.abs().max()), rtol=1e-2)


def test_a_16_bit_weight_of_another_type_than_x_is_refused():
    x = torch.ones(2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="without a scale"):
        batch_gemm(x, torch.ones(32, 64, dtype=torch.bfloat16))
