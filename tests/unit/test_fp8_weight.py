import pytest
import torch

from kvferry.kernels.fp8_weight import (
    FP8_DTYPE,
    Fp8Weight,
    fp8_from_checkpoint,
    quantize_fp8,
    quantize_rows,
    stack_fp8,
)


def _weight(rows: int, cols: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # Rows of very different magnitudes: one scale per row must serve each of them.
    return torch.randn(rows, cols, generator=generator) * torch.logspace(-3, 1, rows)[:, None]


def test_absmax_rows_stay_within_fp8_rounding():
    weight = _weight(64, 256, seed=1)
    data, scale = quantize_rows(weight)
    error = (data.float() * scale[:, None] - weight).abs().amax(dim=1)
    # e4m3 keeps 3 mantissa bits: half an ulp is 1/16 of the value, and the row's largest value sets the scale.
    assert torch.all(error <= weight.abs().amax(dim=1) / 16)
    assert torch.all(error > 0)  # it did quantize


def test_weights_clip_a_row_only_where_that_brings_it_nearer():
    weight = _weight(64, 256, seed=4)
    quantized = quantize_fp8(weight)
    assert quantized.data.dtype == FP8_DTYPE and quantized.scale.shape == (64,)
    data, scale = quantize_rows(weight)
    absmax_error = (data.float() * scale[:, None] - weight).square().sum(dim=1)
    error = (quantized.dequantize(torch.float32) - weight).square().sum(dim=1)
    assert torch.all(error <= absmax_error)
    clipped = quantized.scale < scale
    assert clipped.any() and torch.all(error[clipped] < absmax_error[clipped])


def test_a_row_of_zeros_stays_zero():
    weight = _weight(4, 32, seed=2)
    weight[2] = 0
    assert torch.equal(quantize_fp8(weight).dequantize(torch.float32)[2], torch.zeros(32))


@pytest.mark.parametrize("scale_shape", [(), (1,), (8,), (8, 1)])
def test_checkpoint_scales_per_tensor_or_per_channel_become_one_per_row(scale_shape):
    data = _weight(8, 16, seed=3).clamp(-400, 400).to(FP8_DTYPE)
    scale = torch.rand(scale_shape) + 0.5
    weight = fp8_from_checkpoint(data, scale)
    want = data.float() * scale.reshape(-1, 1).expand(8, 1)
    assert torch.equal(weight.dequantize(torch.float32), want)


def test_a_checkpoint_scale_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match="1 or 8 scales"):
        fp8_from_checkpoint(torch.zeros(8, 16).to(FP8_DTYPE), torch.ones(4))


def test_stacked_weights_keep_each_part_s_scales():
    parts = [quantize_fp8(_weight(rows, 16, seed=rows)) for rows in (8, 4, 4)]
    stacked = stack_fp8(parts)
    want = torch.cat([part.dequantize(torch.float32) for part in parts])
    assert torch.equal(stacked.dequantize(torch.float32), want)


def test_bad_fp8_weights_are_refused():
    with pytest.raises(ValueError, match="2-d"):
        Fp8Weight(torch.zeros(8, 16), torch.ones(8))
    with pytest.raises(ValueError, match="scale"):
        Fp8Weight(torch.zeros(8, 16).to(FP8_DTYPE), torch.ones(8, 1))
