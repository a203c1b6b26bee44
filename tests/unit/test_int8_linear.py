"""int8 weights on the CPU (kernels/int8_linear.py): per-row quantization; the product against the dequantized
weight and the block-quantized activations in float64, from one row to prefill's hundreds, bfloat16 and
float32 rows; fbgemm's
path under KVFERRY_KERNELS=torch; each row's result independent of its batch; the inputs refused. The C kernel
itself, shape by shape, thread counts and its plain C variant: tests/unit/test_cpu_gemv.py."""

import pytest
import torch

from kvferry.kernels import cpu_gemv, dispatch
from kvferry.kernels.int8_linear import INT8_MAX, quantize_int8

SIDES = ["auto", "torch"]  # KVFERRY_KERNELS: the C kernel, fbgemm


def _weight(rows: int, cols: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # Rows of very different magnitudes: one scale per row must serve each of them.
    return torch.randn(rows, cols, generator=generator) * torch.logspace(-3, 1, rows)[:, None]


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def test_each_row_keeps_within_half_a_step_of_its_own_scale():
    weight = _weight(48, 160, seed=1)
    dequantized = quantize_int8(weight).dequantize(torch.float32)
    error = (dequantized - weight).abs().amax(dim=1)
    step = weight.abs().amax(dim=1) / INT8_MAX
    assert torch.all(error <= step / 2 * 1.001)
    assert torch.all(error > 0)  # it did quantize


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 16, 65, 300])
def test_the_product_is_the_dequantized_weight_s_to_float32_or_bfloat16_rounding(rows, dtype):
    """The C kernel multiplies the activations quantized in blocks of 32 (cpu_gemv.quantized_rows): the
    product sits within float32's rounding of the dequantized weight's with those activations (bfloat16: and
    the output's, 2^-9), and about as near the unquantized product as the weights' own rounding (about 1%)
    puts it."""
    generator = torch.Generator().manual_seed(3)
    weight, bias = _weight(97, 579, seed=2), torch.randn(97, generator=generator).to(dtype)
    quantized = quantize_int8(weight)
    x = torch.randn(rows, 579, generator=generator).to(dtype)
    x[0] *= 1000  # a row with large values and one with an outlier channel
    x[-1, 17] = 80.0
    want = cpu_gemv.quantized_rows(x) @ quantized.dequantize(torch.float64).T + bias.double()
    got = dispatch.linear(x, quantized, bias)
    assert got.dtype == dtype and got.shape == (rows, 97)
    tolerance = 1e-5 if dtype == torch.float32 else 2**-8
    for row in {0, rows // 2, rows - 1}:
        assert _relative_error(got[row], want[row]) < tolerance, row
    unquantized = x.double() @ weight.double().T + bias.double()
    assert 3e-3 < _relative_error(got, unquantized) < 3e-2  # the weights' rounding, and the activations'


@pytest.mark.parametrize("side", SIDES)
def test_a_row_gets_the_same_result_alone_and_in_any_batch(side, monkeypatch):
    monkeypatch.setenv(dispatch.BACKEND_VARIABLE, side)
    weight = quantize_int8(_weight(64, 256, seed=4))
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(5))
    x[4] *= 1e4  # a neighbour with a range far wider than the others'
    batched = dispatch.linear(x, weight, None)
    for row in range(9):
        assert torch.equal(dispatch.linear(x[row : row + 1], weight, None), batched[row : row + 1]), row
    assert torch.equal(dispatch.linear(x[[3, 0]], weight, None), batched[[3, 0]])


def test_kvferry_kernels_torch_takes_fbgemm_s_path_with_its_13_bit_activations(monkeypatch):
    """fbgemm rounds the activations to about 13 bits over each row's span: near the dequantized weight's product
    even in the row whose one outlier channel, 80 times the rest, sets the span. Its packed copy is made on
    the first such call only."""
    weight = quantize_int8(_weight(96, 576, seed=2))
    x = torch.randn(5, 576, generator=torch.Generator().manual_seed(3))
    x[1] *= 1000
    x[2, 17] = 80.0
    want = x.double() @ weight.dequantize(torch.float64).T
    dispatch.linear(x, weight, None)
    assert "fbgemm" not in vars(weight)  # the C kernel's calls leave it unmade
    monkeypatch.setenv(dispatch.BACKEND_VARIABLE, "torch")
    got = dispatch.linear(x, weight, None)
    assert "fbgemm" in vars(weight)
    for row in range(5):
        assert 1e-5 < _relative_error(got[row], want[row]) < 3e-3, row  # rounded, but not far


@pytest.mark.parametrize("side", SIDES)
def test_bias_leading_dimensions_and_dtype_are_kept(side, monkeypatch):
    monkeypatch.setenv(dispatch.BACKEND_VARIABLE, side)
    weight = quantize_int8(_weight(32, 64, seed=6))
    bias = torch.randn(32, generator=torch.Generator().manual_seed(8))
    for dtype in (torch.bfloat16, torch.float16):  # float16: computed in float32
        x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(7)).to(dtype)
        got = dispatch.linear(x, weight, bias.to(dtype))
        assert got.dtype == dtype and got.shape == (2, 3, 32)
        want = x.double() @ weight.dequantize(torch.float64).T + bias.to(dtype).double()
        assert _relative_error(got, want) < 1e-2  # the output's rounding (and fbgemm's activations')


def test_zeros_stay_zeros():
    weight = _weight(8, 32, seed=8)
    weight[3] = 0.0
    quantized = quantize_int8(weight)
    assert torch.equal(quantized.dequantize(torch.float32)[3], torch.zeros(32))
    assert torch.equal(dispatch.linear(torch.zeros(2, 32), quantized, None), torch.zeros(2, 8))


def test_what_int8_cannot_take_is_refused():
    with pytest.raises(ValueError, match="2-d CPU tensors"):
        quantize_int8(torch.randn(4, 4, 4))
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="CPU only"):
            dispatch.linear(torch.randn(1, 32, device="cuda"), quantize_int8(_weight(8, 32, seed=9)), None)
