"""The C linear kernel of the CPU's decode batches (kernels/cpu_gemv.py) against float64 sums of the same
inputs: bfloat16 and float32 weights, and int8 weights with a scale an output against bfloat16 and float32
rows (their activations quantized in blocks, as `cpu_gemv.quantized_rows` says); the kernel for the CPU's vector instructions and the plain C one, one and two threads, shapes whose N
and K fall off the kernel's tiles and pairs; every output written; each row's result the same bits alone or in
a batch and on any thread count; the packing undone; bad operands refused; cpu_linear's choice of it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvferry.kernels import cpu_gemv, cpu_linear, dispatch

SHAPES = [  # (rows, N, K)
    (1, 576, 576), (1, 1, 1), (2, 33, 7), (3, 31, 65), (8, 64, 96), (9, 100, 1537), (16, 960, 576),
    (17, 47, 130), (33, 32, 31), (256, 65, 64),
]  # fmt: skip
KERNELS = ["portable", "vector"]
# (x's dtype, the weight's): the weight in x's dtype, or int8 with a float32 scale an output row
FORMS = [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32), (torch.bfloat16, torch.int8),
         (torch.float32, torch.int8)]  # fmt: skip
FORM_NAMES = ["bfloat16", "float32", "bfloat16 x int8", "float32 x int8"]


def _runs_here(kernel: str, weight_dtype: torch.dtype) -> None:
    if kernel == "vector" and not cpu_gemv.has_vector_kernel(weight_dtype):
        pytest.skip(f"this CPU lacks the instructions of the {weight_dtype} vector kernel")


def _case(rows: int, n: int, k: int, dtype: torch.dtype, seed: int, weight_dtype: torch.dtype | None = None):
    """x, the packed weight, the weight as it multiplies (float64 for int8: its values times their scales),
    and a bias; int8 rows' scales span four decades, as a model's rows may."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=generator).to(dtype)
    bias = torch.randn(n, generator=generator).to(dtype)
    if (weight_dtype or dtype) != torch.int8:
        weight = torch.randn(n, k, generator=generator).to(dtype)
        return x, cpu_gemv.pack(weight), weight, bias
    values = torch.randint(-127, 128, (n, k), generator=generator, dtype=torch.int8)
    scales = torch.logspace(-3, 1, n)[torch.randperm(n, generator=generator)]
    return x, cpu_gemv.pack(values, scales), values.double() * scales.double()[:, None], bias


def _assert_within_rounding(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """|out - exact| within float32's sum of K products (K ulps of the sum of their magnitudes; one more for an
    int8 weight's scale, as float64 `weight` says) plus, for bfloat16, the output's one rounding (half a
    bfloat16 step, 2^-8 relative)."""
    exact = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    magnitudes = F.linear(x.double().abs(), weight.double().abs(), None if bias is None else bias.double().abs())
    roundings = x.shape[1] + (weight.dtype == torch.float64)
    bound = roundings * 2.0**-23 * magnitudes + (2.0**-8 * exact.abs() if out.dtype == torch.bfloat16 else 0)
    excess = (out.double() - exact).abs() - bound
    assert excess.max() <= 0, f"off by {excess.max():.3g} beyond the bound at {divmod(int(excess.argmax()), out.shape[1])}"


@pytest.mark.parametrize(("dtype", "weight_dtype"), FORMS, ids=FORM_NAMES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("rows", "n", "k"), SHAPES)
def test_the_kernel_is_the_exact_sum_within_rounding(rows, n, k, threads, kernel, dtype, weight_dtype):
    _runs_here(kernel, weight_dtype)
    x, packed, weight, bias = _case(rows, n, k, dtype, seed=rows * n + k, weight_dtype=weight_dtype)
    out = torch.full((rows, n), float("nan"), dtype=dtype)  # poisoned: every output must be written
    cpu_gemv.linear(x, packed, bias if rows % 2 else None, threads, kernel == "portable", out=out)
    assert not out.isnan().any()
    multiplied = cpu_gemv.quantized_rows(x) if weight_dtype == torch.int8 else x
    _assert_within_rounding(out, multiplied, weight, bias if rows % 2 else None)


@pytest.mark.parametrize(("dtype", "weight_dtype"), FORMS, ids=FORM_NAMES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_row_s_output_is_the_same_alone_in_a_batch_and_on_any_thread_count(kernel, dtype, weight_dtype):
    _runs_here(kernel, weight_dtype)
    x, packed, _, _ = _case(19, 200, 333, dtype, seed=5, weight_dtype=weight_dtype)
    portable = kernel == "portable"
    batched = cpu_gemv.linear(x, packed, threads=1, portable=portable)
    assert torch.equal(cpu_gemv.linear(x, packed, threads=2, portable=portable), batched)
    for row in (0, 8, 18):
        assert torch.equal(cpu_gemv.linear(x[row : row + 1], packed, threads=2, portable=portable), batched[row : row + 1])


@pytest.mark.parametrize(("dtype", "weight_dtype"), FORMS, ids=FORM_NAMES)
def test_the_vector_and_plain_kernels_agree(dtype, weight_dtype):
    _runs_here("vector", weight_dtype)
    x, packed, _, bias = _case(5, 70, 99, dtype, seed=3, weight_dtype=weight_dtype)
    vector = cpu_gemv.linear(x, packed, bias, portable=False)
    portable = cpu_gemv.linear(x, packed, bias, portable=True)
    if weight_dtype == torch.int8:  # exact integer sums, then the same float32 steps in the same order
        assert torch.equal(portable, vector)
    else:
        torch.testing.assert_close(portable, vector, rtol=2**-7, atol=1e-5)


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32, torch.int8])
@pytest.mark.parametrize(("n", "k"), [(1, 1), (33, 7), (64, 96)])
def test_unpack_gives_back_the_packed_weight(n, k, weight_dtype):
    weight = torch.randint(-127, 128, (n, k), dtype=torch.int8).to(weight_dtype)
    scales = torch.rand(n) if weight_dtype == torch.int8 else None
    assert torch.equal(cpu_gemv.unpack(cpu_gemv.pack(weight, scales)), weight)


def test_bad_operands_are_refused_before_the_kernel_reads_them():
    x, packed, weight, bias = _case(4, 40, 64, torch.bfloat16, seed=1)
    for bad_x in (x.t().contiguous().t(), x.float(), x[:, :62].contiguous(), x[None]):  # not packed [rows, 64] rows
        with pytest.raises(ValueError, match=r"x must be a packed \[rows, 64\] tensor"):
            cpu_gemv.linear(bad_x, packed)
    with pytest.raises(ValueError, match="bias"):
        cpu_gemv.linear(x, packed, bias.float())
    with pytest.raises(ValueError, match="out"):
        cpu_gemv.linear(x, packed, out=torch.empty(4, 41, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bfloat16, float32 or int8"):
        cpu_gemv.pack(weight.half())
    values, scales = weight.to(torch.int8), torch.ones(40)
    with pytest.raises(ValueError, match="int8 weights come with their scales"):
        cpu_gemv.pack(values)
    with pytest.raises(ValueError, match="int8 weights come with their scales"):
        cpu_gemv.pack(weight, scales)
    with pytest.raises(ValueError, match=r"one scale an output row: \[40\]"):
        cpu_gemv.pack(values, scales[:39])
    int8 = cpu_gemv.pack(values, scales)
    with pytest.raises(ValueError, match="bfloat16 or float32 for int8 weights"):
        cpu_gemv.linear(x.half(), int8)
    with pytest.raises(ValueError, match="bias"):
        cpu_gemv.linear(x, int8, bias.float())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_linear_takes_the_c_kernel_and_onednn_without_the_c_kernels(dtype, monkeypatch):
    x, _, weight, bias = _case(3, 48, 80, dtype, seed=2)
    non_contiguous = x.t().contiguous().t()
    assert cpu_linear.applies(non_contiguous, weight)
    out = dispatch.linear(non_contiguous, weight, bias)
    assert id(weight) in cpu_linear._packed_weights and id(weight) not in cpu_linear._onednn_weights
    _assert_within_rounding(out, x, weight, bias)
    monkeypatch.setenv(dispatch.BACKEND_VARIABLE, "torch")
    torch_side = dispatch.linear(x, weight, bias)
    if dtype in cpu_linear.ONEDNN_DTYPES:
        assert id(weight) in cpu_linear._onednn_weights
    torch.testing.assert_close(torch_side, out, rtol=2**-7 if dtype == torch.bfloat16 else 1e-5, atol=1e-4)
