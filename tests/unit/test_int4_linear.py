"""int4 weights on the CPU (kernels/int4_linear.py): groups of 32 quantized from their own range, torch's int4
product against the dequantized weight, each row's result independent of its batch, and the inputs refused."""

import pytest
import torch

from kvferry.kernels.int4_linear import GROUP, LEVELS, linear, quantize_int4


def _weight(rows: int, cols: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # Rows of very different magnitudes, each off centre: the groups' ranges are not symmetric about zero.
    scales = torch.logspace(-3, 1, rows)[:, None]
    return (torch.randn(rows, cols, generator=generator) + 0.5) * scales


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).norm() / want.norm())


def test_each_group_keeps_within_half_a_step_of_its_own_range():
    weight = _weight(48, 4 * GROUP, seed=1)
    dequantized = quantize_int4(weight).dequantize(torch.float32)
    groups, back = weight.reshape(48, -1, GROUP), dequantized.reshape(48, -1, GROUP)
    step = (groups.amax(dim=-1) - groups.amin(dim=-1)) / LEVELS
    # Half a step, plus what rounding the zero and the product to bfloat16 adds (half an ulp each).
    bound = step / 2 * 1.02 + groups.abs().amax(dim=-1) * 2**-8
    assert torch.all((back - groups).abs().amax(dim=-1) <= bound)
    assert _relative_error(dequantized, weight) > 1e-3  # it did quantize


def test_sixteen_levels_a_group_come_back_as_they_were():
    """A group that already holds 16 evenly spaced values (as a Q4_1 file's dequantized weights do) keeps
    them: the levels are chosen against the scale and zero as the kernel reads them."""
    generator = torch.Generator().manual_seed(2)
    levels = torch.randint(0, LEVELS + 1, (64, 8, GROUP), generator=generator)
    levels[..., 0], levels[..., 1] = 0, LEVELS  # every group spans all sixteen
    scale = torch.rand(64, 8, 1, generator=generator) * 0.01 + 1e-3
    weight = (levels * scale - 8 * scale).reshape(64, 8 * GROUP)
    dequantized = quantize_int4(weight).dequantize(torch.float32).reshape(64, 8, GROUP)
    recovered = torch.round((dequantized + 8 * scale) / scale)
    assert torch.equal(recovered, levels.float())


def test_the_product_is_the_dequantized_weight_s_in_bfloat16():
    weight = quantize_int4(_weight(96, 576, seed=3))
    x = torch.randn(5, 576, generator=torch.Generator().manual_seed(4))
    x[1] *= 1000
    want = x.to(torch.bfloat16).float() @ weight.dequantize(torch.float32).T
    got = linear(x, weight, None)
    assert got.dtype == torch.float32 and got.shape == (5, 96)
    for row in range(5):
        assert _relative_error(got[row], want[row]) < 1e-2, row  # bfloat16's rounding of the output
    assert _relative_error(got, x @ _weight(96, 576, seed=3).T) > 2e-2  # what 4 bits cost


def test_a_row_gets_the_same_result_alone_and_in_any_batch():
    weight = quantize_int4(_weight(64, 256, seed=5))
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    x[4] *= 1e4
    batched = linear(x, weight, None)
    for row in range(9):
        assert torch.equal(linear(x[row : row + 1], weight, None), batched[row : row + 1]), row
    assert torch.equal(linear(x[[3, 0]], weight, None), batched[[3, 0]])


def test_bias_leading_dimensions_and_dtype_are_kept():
    weight = quantize_int4(_weight(32, 64, seed=7))
    bias = torch.randn(32, dtype=torch.bfloat16)
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    got = linear(x, weight, bias)
    assert got.dtype == torch.bfloat16 and got.shape == (2, 3, 32)
    want = x.float() @ weight.dequantize(torch.float32).T + bias.float()
    assert _relative_error(got, want) < 1e-2


def test_rows_beyond_a_multiple_of_sixteen_are_kept():
    """The packing takes rows sixteen at a time (a vocabulary of 1501 is not): padded, and left out again."""
    weight = _weight(21, 64, seed=11)
    quantized = quantize_int4(weight)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(12))
    got = linear(x, quantized, None)
    assert got.shape == (3, 21) and quantized.dequantize(torch.float32).shape == (21, 64)
    want = x.to(torch.bfloat16).float() @ quantized.dequantize(torch.float32).T
    assert _relative_error(got, want) < 1e-2


def test_a_constant_group_and_zeros_stay_exact():
    weight = _weight(16, 2 * GROUP, seed=9)
    weight[3] = 0.0
    weight[5, :GROUP] = 0.25
    dequantized = quantize_int4(weight).dequantize(torch.float32)
    assert torch.equal(dequantized[3], torch.zeros(2 * GROUP))
    assert torch.equal(dequantized[5, :GROUP], torch.full((GROUP,), 0.25))


def test_what_int4_cannot_take_is_refused():
    with pytest.raises(ValueError, match="2-d CPU tensors"):
        quantize_int4(torch.randn(4, 4, GROUP))
    with pytest.raises(ValueError, match=f"divisible by {GROUP}"):
        quantize_int4(torch.randn(16, GROUP + 8))
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="CPU only"):
            linear(torch.randn(1, GROUP, device="cuda"), quantize_int4(_weight(16, GROUP, seed=10)), None)
