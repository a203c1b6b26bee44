"""int8 weights on the CPU (kernels/int8_linear.py): per-row quantization, fbgemm's product against the
dequantized weight, each row's result independent of its batch, and the inputs refused."""

import pytest
import torch

from kvferry.kernels.int8_linear import INT8_MAX, linear, quantize_int8


def _weight(rows: int, cols: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # Rows of very different magnitudes: one scale per row must serve each of them.
    return torch.randn(rows, cols, generator=generator) * torch.logspace(-3, 1, rows)[:, None]


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).norm() / want.norm())


def test_each_row_keeps_within_half_a_step_of_its_own_scale():
    weight = _weight(48, 160, seed=1)
    dequantized = quantize_int8(weight).dequantize(torch.float32)
    error = (dequantized - weight).abs().amax(dim=1)
    step = weight.abs().amax(dim=1) / INT8_MAX
    assert torch.all(error <= step / 2 * 1.001)
    assert torch.all(error > 0)  # it did quantize


def test_the_product_is_the_dequantized_weight_s_to_the_activations_rounding():
    """About 13 bits per activation (two 7-bit rows) over each row's own span: the product sits far nearer the
    dequantized weight's than the weights' own rounding (about 1%) does, even in the row whose one outlier
    channel, 80 times the rest, sets the span (0.16% there, 0.01% in the others)."""
    weight = quantize_int8(_weight(96, 576, seed=2))
    x = torch.randn(5, 576, generator=torch.Generator().manual_seed(3))
    x[1] *= 1000  # a row with large values and one with an outlier channel
    x[2, 17] = 80.0
    want = x @ weight.dequantize(torch.float32).T
    got = linear(x, weight, None)
    assert got.dtype == torch.float32 and got.shape == (5, 96)
    for row in range(5):
        assert _relative_error(got[row], want[row]) < 3e-3, row
    assert _relative_error(got, x @ _weight(96, 576, seed=2).T) > 3e-3  # what the weights' rounding costs


def test_a_row_gets_the_same_result_alone_and_in_any_batch():
    weight = quantize_int8(_weight(64, 256, seed=4))
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(5))
    x[4] *= 1e4  # a neighbour with a range far wider than the others'
    batched = linear(x, weight, None)
    for row in range(9):
        assert torch.equal(linear(x[row : row + 1], weight, None), batched[row : row + 1]), row
    assert torch.equal(linear(x[[3, 0]], weight, None), batched[[3, 0]])


def test_bias_leading_dimensions_and_dtype_are_kept():
    weight = quantize_int8(_weight(32, 64, seed=6))
    bias = torch.randn(32)
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    got = linear(x, weight, bias)
    assert got.dtype == torch.bfloat16 and got.shape == (2, 3, 32)
    want = x.float() @ weight.dequantize(torch.float32).T + bias
    assert _relative_error(got, want) < 1e-2  # bf16's rounding of the output


def test_zeros_stay_zeros():
    weight = _weight(8, 32, seed=8)
    weight[3] = 0.0
    quantized = quantize_int8(weight)
    assert torch.equal(quantized.dequantize(torch.float32)[3], torch.zeros(32))
    assert torch.equal(linear(torch.zeros(2, 32), quantized, None), torch.zeros(2, 8))


def test_what_int8_cannot_take_is_refused():
    with pytest.raises(ValueError, match="2-d CPU tensors"):
        quantize_int8(torch.randn(4, 4, 4))
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="CPU only"):
            linear(torch.randn(1, 32, device="cuda"), quantize_int8(_weight(8, 32, seed=9)), None)
