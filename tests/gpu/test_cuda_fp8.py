"""FP8 weights on the GPU: each kernel of kernels/fp8_linear.py against the dequantized weight in float32, at
the 8B shapes and at odd ones, and the tiny model served in FP8 with CUDA graphs against its CPU run, which
dequantizes. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvferry.kernels.fp8_weight import quantize_fp8

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = "cuda"
# bf16 activations and output against a float32 product of the same FP8 weights: the output's rounding.
TOLERANCE = 1e-2
# Activations quantized to FP8 per row as well (the prefill path): e4m3's rounding of both operands.
SCALED_MM_TOLERANCE = 6e-2


def _case(rows: int, n: int, k: int, seed: int):
    generator = torch.Generator(device=CUDA).manual_seed(seed)
    weight = quantize_fp8(torch.randn(n, k, device=CUDA, generator=generator) * torch.rand(n, 1, device=CUDA, generator=generator))
    x = torch.randn(rows, k, device=CUDA, generator=generator).to(torch.bfloat16)
    return x, weight, F.linear(x.float(), weight.dequantize(torch.float32))


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).norm() / want.norm())


@pytest.mark.parametrize("rows", [1, 2, 7, 16, 33, 64, 65, 300])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 14336), (301, 1040)])
def test_fp8_linear_matches_the_dequantized_weight(monkeypatch, rows, n, k):
    from kvferry.kernels import dispatch as kernels

    monkeypatch.setenv("KVFERRY_KERNELS", "triton")
    x, weight, want = _case(rows, n, k, seed=rows * n)
    got = kernels.linear(x, weight)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
    bound = SCALED_MM_TOLERANCE if rows > 64 else TOLERANCE
    assert _relative_error(got, want) < bound


@pytest.mark.parametrize("integer_widening", [True, False], ids=["words", "cvt"])
@pytest.mark.parametrize("rows", [2, 16, 64])
def test_the_split_k_gemm_writes_every_output(rows, integer_widening):
    """o_proj's shape splits K across programs that add into one float32 output."""
    from kvferry.kernels.triton_fp8_gemm import Fp8GemmTiling, fp8_gemm

    x, weight, want = _case(rows, 4096, 4096, seed=rows)
    got = fp8_gemm(x, weight.data, weight.scale, Fp8GemmTiling(integer_widening=integer_widening))
    assert torch.isfinite(got).all() and _relative_error(got, want) < TOLERANCE


def test_the_tiny_model_in_fp8_decodes_the_same_from_cuda_graphs_as_eagerly(tiny_models):
    """FP8 weights on the card, decode steps replayed from CUDA graphs (the GEMV, the weight-only GEMM) against
    the same engine launching each kernel itself. Not against the CPU: there the prefill dequantizes, on the
    GPU it multiplies FP8 activations (cuBLAS), and on this random model that alone parted 47 of 144 tokens
    (H200, 2026-12-06); kernels/fp8_linear.py's paths are checked one by one above."""
    from kvferry.engine import LLM, SamplingParams
    from kvferry.kernels.fp8_weight import Fp8Weight

    prompts = [{"prompt_token_ids": list(range(3 + i, 40 + 7 * i))} for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    runs = {}
    for eager in (False, True):
        llm = LLM(tiny_models["llama"], dtype="bfloat16", device="cuda", quantization="fp8", kv_cache_bytes=1 << 28,
                  enforce_eager=eager)  # fmt: skip
        weights = llm.engine.runner.model.weights
        assert isinstance(weights.layers[0].qkv, Fp8Weight) and weights.layers[0].qkv.device.type == "cuda"
        assert (llm.engine.runner.graphs is None) is eager
        runs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    same = sum(a == b for g, e in zip(runs[False], runs[True], strict=True) for a, b in zip(g, e, strict=True))
    assert same / sum(len(e) for e in runs[True]) >= 0.95, runs
