"""The real default model, SmolLM2-135M-Instruct, served in FP8 on the GPU (weights quantized at load, read by
the Triton FP8 GEMV and GEMM) against the same engine in bf16 on the GPU.

Issue 25 asks that FP8's reply to each of 8 prompts repeat bf16's first 8 tokens. On the CPU (dequantized
FP8, docs/models.md) that held for 4 of the 8, the partings at float32 top-two margins of 0.026-0.76. This
test prints the count on the GPU, and holds what a correct FP8 path reaches on any device: teacher-forced
top-1 agreement with bf16 (FP8's pick after each prefix of bf16's reply) at the CPU test's floor, which a
broken scale, layout or kernel falls far below.
"""

from __future__ import annotations

import pytest
import torch
from support.real_model import RealModel, Reference, engine_greedy, greedy_cases, teacher_forced_agreement

from kvferry.engine import LLM

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

TOKENS = 32
FIRST_TOKENS = 8
MIN_AGREEMENT = 0.85  # as tests/integration/test_fp8_weights.py; measured 92.6% on the CPU
# A fixed pool, not a share of the card: an engine a failed test left alive must not starve the next one.
KV_CACHE_BYTES = 1 << 30


def test_the_real_model_in_fp8_on_the_gpu_picks_bf16_s_tokens(smollm2: RealModel, smollm2_reference: Reference):
    prompts = [case.prompt_ids for case in greedy_cases(smollm2_reference.model, smollm2_reference.tokenizer, 1)]
    bf16 = LLM(smollm2.folder, dtype="bfloat16", device="cuda", kv_cache_bytes=KV_CACHE_BYTES)
    fp8 = LLM(smollm2.folder, dtype="bfloat16", device="cuda", kv_cache_bytes=KV_CACHE_BYTES, quantization="fp8")
    assert fp8.engine.device.type == "cuda"
    bf16_replies = engine_greedy(bf16, prompts, TOKENS)
    fp8_replies = engine_greedy(fp8, prompts, TOKENS)
    same_start = sum(a[:FIRST_TOKENS] == b[:FIRST_TOKENS] for a, b in zip(bf16_replies, fp8_replies, strict=True))
    agreement = teacher_forced_agreement(fp8, prompts, bf16_replies)
    print(f"\nFP8 on the GPU: {same_start} of {len(prompts)} replies repeat bf16's first {FIRST_TOKENS} tokens; "
          f"teacher-forced top-1 agreement {agreement:.1%} over {len(prompts)} x {TOKENS} tokens")
    assert agreement >= MIN_AGREEMENT
