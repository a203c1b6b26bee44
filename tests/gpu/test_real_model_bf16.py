"""The real default model, SmolLM2-135M-Instruct, served in bfloat16 on the GPU against transformers.

Measured first (8 prompts, 16 greedy tokens, H200): transformers' own bfloat16 run parts from its float32
run on one prompt, at the first token, where float32's top two logits are 0.026 apart; kvferry's
bfloat16 runs part from float32 on one prompt each (alone: at 0.10, batched: at 0.010), and the two
bfloat16 implementations part from each other only at such near-ties. So token identity with transformers
bfloat16 over 16 tokens is a coin toss at near-ties, not a property of a correct engine. What this test
holds instead, on the float32 run as the truth:
- wherever kvferry's bfloat16 tokens part from float32's, float32's top-two margin there is a near-tie
  (below NEAR_TIE logits): a precision bug (rope, norms, attention in the wrong dtype) parts at large margins;
- kvferry bfloat16 agrees with float32 over all 16 tokens on at least as many prompts as transformers
  bfloat16 does, one prompt at a time and batched.
"""

from __future__ import annotations

import pytest
import torch
from support.real_model import CHAT_PROMPTS, RAW_PROMPTS, GreedyCase, RealModel, engine_prompt, greedy_cases

from kvferry.engine import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

TOKENS = 16
# Logits. The widest float32 top-two margin at which a bfloat16 run (either implementation) was seen to
# part from float32 was 0.13; bfloat16 rounds logits of this model's size (about 20) by up to 0.06.
NEAR_TIE = 0.15
# A fixed pool, not a share of the card: an engine a failed test left alive must not starve the next one.
KV_CACHE_BYTES = 1 << 30


def _load(smollm2: RealModel, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    folder, name = str(smollm2.gguf.parent), smollm2.gguf.name
    return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype).to("cuda").eval()


@torch.no_grad()
def _margins(model: torch.nn.Module, case: GreedyCase) -> list[float]:
    """float32's top-two logit margin at each generated position of its own greedy path (one forward)."""
    ids = torch.tensor([case.prompt_ids + case.output_ids], device="cuda")
    logits = model(ids).logits[0, len(case.prompt_ids) - 1 : -1].float()
    top = torch.topk(logits, 2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


@pytest.fixture(scope="module")
def references(smollm2: RealModel) -> tuple[list[GreedyCase], list[list[float]], list[list[int]]]:
    """float32 greedy cases, their margins, and transformers' bfloat16 greedy tokens for the same prompts."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2.gguf.parent), gguf_file=smollm2.gguf.name)
    float32 = _load(smollm2, torch.float32)
    cases = greedy_cases(float32, tokenizer, TOKENS)
    margins = [_margins(float32, case) for case in cases]
    del float32
    bfloat16 = [case.output_ids for case in greedy_cases(_load(smollm2, torch.bfloat16), tokenizer, TOKENS)]
    return cases, margins, bfloat16


def _first_difference(expected: list[int], got: list[int]) -> int | None:
    for position, (want, have) in enumerate(zip(expected, got, strict=False)):
        if want != have:
            return position
    return None if len(expected) == len(got) else min(len(expected), len(got))


def test_bf16_greedy_parts_from_float32_only_at_near_ties(smollm2: RealModel, references) -> None:
    cases, margins, transformers_bf16 = references
    assert len(cases) == len(CHAT_PROMPTS) + len(RAW_PROMPTS)
    llm = LLM(smollm2.folder, dtype="bfloat16", device="cuda", kv_cache_bytes=KV_CACHE_BYTES)
    assert llm.engine.device.type == "cuda"
    params = SamplingParams(max_tokens=TOKENS, temperature=0)
    runs = {
        "alone": [llm.generate(engine_prompt(case), params)[0].outputs[0].token_ids for case in cases],
        "batched": [o.outputs[0].token_ids for o in llm.generate([engine_prompt(c) for c in cases], params)],
    }
    expected = [case.output_ids for case in cases]

    def agreeing(outputs: list[list[int]]) -> int:
        return sum(_first_difference(want, got) is None for want, got in zip(expected, outputs, strict=True))

    for name, outputs in runs.items():
        for case, margin, got in zip(cases, margins, outputs, strict=True):
            position = _first_difference(case.output_ids, got)
            print(f"{name:8} {case.text!r}: parts from float32 at {position}"
                  + (f" (float32 margin {margin[position]:.3f})" if position is not None and position < len(margin) else ""))
            if position is not None:
                assert position < len(margin) and margin[position] < NEAR_TIE, (name, case.text, position, margin)
        print(f"{name}: {agreeing(outputs)} of {len(cases)} agree with float32; transformers bfloat16: "
              f"{agreeing(transformers_bf16)}")
        assert agreeing(outputs) >= agreeing(transformers_bf16)
