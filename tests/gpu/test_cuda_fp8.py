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


@pytest.mark.parametrize("rows", [2, 16, 64])
def test_the_split_k_gemm_writes_every_output(rows):
    """o_proj's shape splits K across programs that add into one float32 output."""
    from kvferry.kernels.triton_fp8_gemm import fp8_gemm

    x, weight, want = _case(rows, 4096, 4096, seed=rows)
    got = fp8_gemm(x, weight.data, weight.scale)
    assert torch.isfinite(got).all() and _relative_error(got, want) < TOLERANCE


def test_the_tiny_model_in_fp8_on_the_gpu_agrees_with_its_cpu_run(tiny_models):
    """CUDA graphs replay the FP8 decode steps; the CPU run dequantizes every matmul. bf16 on both."""
    from kvferry.engine import LLM, SamplingParams

    prompts = [{"prompt_token_ids": list(range(3 + i, 40 + 7 * i))} for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    gpu = LLM(tiny_models["llama"], dtype="bfloat16", device="cuda", quantization="fp8", kv_cache_bytes=1 << 28)
    cpu = LLM(tiny_models["llama"], dtype="bfloat16", device="cpu", quantization="fp8")
    assert gpu.engine.runner.graphs is not None
    got = [o.outputs[0].token_ids for o in gpu.generate(prompts, params)]
    want = [o.outputs[0].token_ids for o in cpu.generate(prompts, params)]
    same = sum(a == b for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True))
    assert same / sum(len(w) for w in want) >= 0.95, (got, want)
