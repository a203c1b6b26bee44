"""The CPU decode-batch linear (oneDNN, weights prepacked): which calls take it, and that it computes F.linear."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F

from kvferry.kernels import cpu_linear, dispatch

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 64, cpu_linear.PACKED_MAX_ROWS])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_matches_f_linear_within_float32_rounding(rows, with_bias):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=generator)
    weight = torch.randn(160, 96, generator=generator)
    bias = torch.randn(160, generator=generator) if with_bias else None
    assert cpu_linear.applies(x, weight)
    torch.testing.assert_close(
        dispatch.linear(x, weight, bias), F.linear(x, weight, bias), rtol=1e-5, atol=1e-4
    )


@pytest.mark.skipif(torch.bfloat16 not in cpu_linear.PACKED_DTYPES, reason="oneDNN has no bfloat16 kernels here")
@pytest.mark.parametrize("rows", [1, 16])
def test_bfloat16_takes_the_packed_path_and_matches_float32_within_bfloat16_rounding(rows):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=generator).bfloat16()
    weight = torch.randn(160, 96, generator=generator).bfloat16()
    assert cpu_linear.applies(x, weight)
    exact = F.linear(x.float(), weight.float())  # the bfloat16 inputs' products, summed in float32
    torch.testing.assert_close(dispatch.linear(x, weight).float(), exact, rtol=1e-2, atol=5e-2)


@pytest.mark.parametrize(
    ("x", "weight"),
    [
        (torch.ones(cpu_linear.PACKED_MAX_ROWS + 1, 8), torch.ones(4, 8)),  # a prefill chunk: MKL's GEMM
        (torch.ones(2, 8, dtype=torch.float16), torch.ones(4, 8, dtype=torch.float16)),
        (torch.ones(2, 8, dtype=torch.bfloat16), torch.ones(4, 8)),
        (torch.ones(2, 3, 8), torch.ones(4, 8)),
        (torch.ones(0, 8), torch.ones(4, 8)),
    ],
    ids=["many-rows", "float16", "mixed-dtypes", "three-dims", "no-rows"],
)
def test_other_calls_keep_f_linear(x, weight):
    assert not cpu_linear.applies(x, weight)


def test_a_weight_is_packed_once_and_its_copy_goes_with_it():
    weight = torch.randn(32, 16)
    x = torch.randn(2, 16)
    dispatch.linear(x, weight)
    packed = cpu_linear._packed_weights[id(weight)]
    dispatch.linear(x, weight)
    assert cpu_linear._packed_weights[id(weight)] is packed
    count = len(cpu_linear._packed_weights)
    del weight, packed
    gc.collect()
    assert len(cpu_linear._packed_weights) == count - 1
