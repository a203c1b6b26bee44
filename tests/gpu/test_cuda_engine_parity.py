"""The engine on the GPU (Triton kernels) against transformers on the GPU.

float32: greedy output is token-identical to `generate`, in every scheduling mode, with decode batches
replayed from CUDA graphs.
bfloat16: greedy decoding is chaotic once two logits sit within bfloat16 rounding, so token identity over
32 steps is not the measure. The rule: transformers scores the engine's own continuation in one teacher-
forced forward, and at each generated position its top-1 token must be the one the engine picked; the
agreement rate over all positions must be at least 0.9. Transformers' agreement with its own incremental
`generate` under the same teacher forcing is printed beside it as the floor that bfloat16 allows.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from kvferry.engine import LLM, SamplingParams
from kvferry.engine.make_model import make_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROMPT_LENGTHS = (1, 5, 16, 33, 64, 128, 200, 300)
NEW_TOKENS = 32
BF16_MIN_AGREEMENT = 0.9
MODES = {
    "default": {},
    "no-prefix-cache": {"enable_prefix_caching": False},
    "chunked-32": {"max_num_batched_tokens": 32},
    "preempting": {"num_kv_blocks": 40},
}
MODELS = [("llama", "tiny"), ("qwen2", "tiny"), ("qwen3", "tiny"), ("llama", "small")]
# A fixed pool, not a share of the card: an engine a failed test left alive must not starve the next one.
KV_CACHE_BYTES = 1 << 30


def _prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(vocab_size) for _ in range(n)] for n in PROMPT_LENGTHS]


def _hf_model(model_dir, dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to("cuda").eval()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-models")
    return {
        (arch, size, dtype): make_model(arch, size, root / f"{arch}-{size}-{dtype}", seed=1, dtype=dtype)
        for arch, size in MODELS
        for dtype in ("float32", "bfloat16")
    }


@pytest.fixture(scope="module")
def float32_references(checkpoints):
    result = {}
    for arch, size in MODELS:
        model = _hf_model(checkpoints[arch, size, "float32"], torch.float32)
        prompts = _prompts(model.config.vocab_size)
        with torch.no_grad():
            outs = [model.generate(torch.tensor([p], device="cuda"), max_new_tokens=NEW_TOKENS, do_sample=False)
                    for p in prompts]  # fmt: skip
        result[arch, size] = (prompts, [o[0, len(p) :].tolist() for o, p in zip(outs, prompts, strict=True)])
        del model
    return result


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize(("arch", "size"), MODELS)
def test_float32_greedy_is_token_identical(arch, size, mode, checkpoints, float32_references):
    prompts, expected = float32_references[arch, size]
    llm = LLM(checkpoints[arch, size, "float32"], dtype="float32", device="cuda", max_model_len=512,
              kv_cache_bytes=KV_CACHE_BYTES, **MODES[mode])  # fmt: skip
    assert llm.engine.device.type == "cuda"
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=NEW_TOKENS))
    got = [o.outputs[0].token_ids for o in outputs]
    for prompt, tokens, want in zip(prompts, got, expected, strict=True):
        assert tokens == want, f"{arch}-{size} {mode}: prompt of {len(prompt)} tokens diverged"
    if mode == "preempting":
        assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.runner.graphs.num_replays > 0, "no decode step ran through a CUDA graph"
    assert llm.engine.runner.graphs.num_fed_replays > 0, "no decode step was launched ahead of its tokens"


def _teacher_forced_agreement(model, prompts: list[list[int]], continuations: list[list[int]]) -> float:
    """Fraction of positions where the model's top-1 token, given the prompt and the continuation so far,
    is the continuation's token."""
    agree = total = 0
    for prompt, continuation in zip(prompts, continuations, strict=True):
        ids = torch.tensor([prompt + continuation], device="cuda")
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1]
        agree += int((logits.argmax(-1).cpu() == torch.tensor(continuation)).sum())
        total += len(continuation)
    return agree / total


@pytest.mark.parametrize(("arch", "size"), MODELS)
def test_bfloat16_top1_agreement(arch, size, checkpoints):
    model_dir = checkpoints[arch, size, "bfloat16"]
    model = _hf_model(model_dir, torch.bfloat16)
    prompts = _prompts(model.config.vocab_size)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    llm = LLM(model_dir, dtype="bfloat16", device="cuda", max_model_len=512, kv_cache_bytes=KV_CACHE_BYTES)
    engine_tokens = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    with torch.no_grad():
        hf_tokens = [
            model.generate(torch.tensor([p], device="cuda"), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                           do_sample=False)[0, len(p) :].tolist()
            for p in prompts
        ]  # fmt: skip
    engine_agreement = _teacher_forced_agreement(model, prompts, engine_tokens)
    floor = _teacher_forced_agreement(model, prompts, hf_tokens)
    identical = sum(e == h for e, h in zip(engine_tokens, hf_tokens, strict=True))
    print(f"\nbf16 {arch}-{size}: engine top-1 agreement {engine_agreement:.3f}, transformers' own {floor:.3f}, "
          f"{identical}/{len(prompts)} continuations identical to generate")  # fmt: skip
    assert engine_agreement >= BF16_MIN_AGREEMENT


@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_programmatic_launch_changes_no_token(quantization, checkpoints, monkeypatch):
    """kernels/pdl.py: the kernels launched with programmatic dependent launch fetch weights before their
    wait and may start while the kernel before still runs. Their arithmetic is the same either way, so the
    engine's greedy tokens must be the same as with every kernel launched the ordinary way; a kernel that
    read its input before the wait would part at random. bf16: batched (GEMMs, attention over a batch) and one
    prompt at a time (the one-row GEMVs). FP8: one prompt at a time, prompts past 64 tokens only, since the
    FP8 GEMM of 2-64 rows adds K's spans with float32 atomics, whose order (and so the last bits) varies
    from run to run with or without PDL (seen on an H100: FP8 batches parted)."""
    from kvferry.kernels import fp8_linear, pdl

    checkpoint = checkpoints["llama", "small", "bfloat16"]
    prompts = _prompts(json.loads((checkpoint / "config.json").read_text())["vocab_size"])
    if quantization == "fp8":
        prompts = [p for p in prompts if len(p) > fp8_linear.SMALL_BATCH]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    runs = {}
    for launch in ("1", "0"):
        monkeypatch.setenv(pdl.VARIABLE, launch)
        llm = LLM(checkpoint, dtype="bfloat16", device="cuda", max_model_len=512,
                  kv_cache_bytes=KV_CACHE_BYTES, quantization=quantization)  # fmt: skip
        alone = [llm.generate({"prompt_token_ids": p}, params)[0].outputs[0].token_ids for p in prompts]
        batched = [] if quantization else [
            o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        ]
        assert llm.engine.runner.graphs.num_replays > 0, "no decode step ran through a CUDA graph"
        runs[launch] = (alone, batched)
        if launch == "1":
            assert pdl.enabled(torch.zeros(1, device="cuda")) == (torch.cuda.get_device_capability()[0] >= 9)
        del llm
    assert runs["1"] == runs["0"]
