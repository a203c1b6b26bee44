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
    from kvferry.kernels.triton_batch_gemm import batch_gemm

    x, weight, want = _case(rows, 4096, 4096, seed=rows)
    got = batch_gemm(x, weight.data, weight.scale)
    assert torch.isfinite(got).all() and _relative_error(got, want) < TOLERANCE


def test_the_tiny_model_in_fp8_decodes_from_cuda_graphs_as_it_does_eagerly(tiny_models):
    """FP8 weights on the card, decode steps replayed from CUDA graphs (the GEMV, the weight-only GEMM) against
    the same engine launching each kernel itself. Tokens alone cannot tell: on this random bf16 model the two
    part at near-ties (107 of 144 tokens equal on an H100, 2026-12-06), since a graph's attention splits the
    context its own way. So up to each prompt's first parting, where both saw the same tokens, the top-1
    log-probability of every step must agree within bf16's rounding; a graph replaying stale inputs or
    another weight moves it by whole units. Not against the CPU: there the prefill dequantizes, on the GPU
    it multiplies FP8 activations (cuBLAS); kernels/fp8_linear.py's paths are checked one by one above."""
    from kvferry.engine import LLM, SamplingParams
    from kvferry.kernels.fp8_weight import Fp8Weight

    prompts = [{"prompt_token_ids": list(range(3 + i, 40 + 7 * i))} for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0)
    runs = {}
    for eager in (False, True):
        llm = LLM(tiny_models["llama"], dtype="bfloat16", device="cuda", quantization="fp8", kv_cache_bytes=1 << 28,
                  enforce_eager=eager)  # fmt: skip
        weights = llm.engine.runner.model.weights
        assert isinstance(weights.layers[0].qkv, Fp8Weight) and weights.layers[0].qkv.device.type == "cuda"
        assert (llm.engine.runner.graphs is None) is eager
        runs[eager] = [output.outputs[0] for output in llm.generate(prompts, params)]
    compared = 0
    for graphed, eager in zip(runs[False], runs[True], strict=True):
        assert graphed.token_ids[0] == eager.token_ids[0]  # the prefill: no graph either way
        parting = next((i for i, (a, b) in enumerate(zip(graphed.token_ids, eager.token_ids, strict=True)) if a != b), 23)
        for step in range(1, parting + 1):
            top_graphed, top_eager = max(graphed.logprobs[step].values()), max(eager.logprobs[step].values())
            assert abs(top_graphed - top_eager) < 0.1, (step, top_graphed, top_eager)
            compared += 1
    assert compared >= 24  # enough graph replays were held to it
