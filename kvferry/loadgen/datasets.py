"""Benchmark prompts with exact token counts: random lengths, shared prefixes, and Mooncake trace replay.

Prompts are text (both endpoints need it), built from words that the model's tokenizer turns into one
token each, leading space included, so that n words joined are exactly n tokens and any two prompts that
share their first k words share their first k tokens. Lengths count the tokens the server will see,
including the special tokens its tokenizer adds (Llama's BOS).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the engine package imports torch; `kvferry --help` must not wait for it
    from kvferry.engine.tokenizer import ModelTokenizer

MIN_WORDS = 64  # below this a vocabulary cannot make varied prompts


@dataclass(frozen=True)
class BenchRequest:
    prompt: str  # the whole prompt of /v1/completions, system_prompt included
    input_tokens: int
    output_tokens: int  # max_tokens, sent with ignore_eos
    system_prompt: str = ""  # the shared part, sent as the system message on /v1/chat/completions
    arrival_s: float | None = None  # trace replay: seconds after the first request
    prompt_token_ids: tuple[int, ...] | None = None  # only for the node API, which takes no text

    @property
    def question(self) -> str:
        return self.prompt[len(self.system_prompt) :]


def with_token_ids(requests: list[BenchRequest], tokenizer: ModelTokenizer) -> list[BenchRequest]:
    return [replace(r, prompt_token_ids=tuple(tokenizer.encode(r.prompt))) for r in requests]


class TokenWords:
    """The tokenizer's single-token words (" the", " cat", ...): text of an exact length in tokens."""

    def __init__(self, tokenizer: ModelTokenizer) -> None:
        self.words: list[str] = []
        for token_id in range(tokenizer.vocab_size):
            text = tokenizer.decode([token_id])
            word = text[1:]
            if text.startswith(" ") and word.isascii() and word.isalpha():
                if tokenizer.encode(text, add_special_tokens=False) == [token_id]:
                    self.words.append(text)
        if len(self.words) < MIN_WORDS:
            raise ValueError(f"the tokenizer has only {len(self.words)} single-token words; need {MIN_WORDS}")
        probe = self.words[0]
        self.special_tokens = len(tokenizer.encode(probe)) - len(tokenizer.encode(probe, add_special_tokens=False))

    def text(self, rng: random.Random, num_tokens: int) -> str:
        return "".join(rng.choices(self.words, k=num_tokens))

    def words_for(self, prompt_tokens: int) -> int:
        """How many words make a prompt of prompt_tokens tokens once the tokenizer adds its special tokens."""
        if prompt_tokens <= self.special_tokens:
            raise ValueError(f"a prompt needs more than {self.special_tokens} tokens (the special tokens)")
        return prompt_tokens - self.special_tokens


@dataclass(frozen=True)
class RandomSpec:
    num_prompts: int
    input_len: int
    output_len: int
    range_ratio: float = 0.0  # lengths drawn uniformly from [len * (1 - r), len * (1 + r)]


def _around(rng: random.Random, length: int, ratio: float) -> int:
    return rng.randint(max(1, round(length * (1 - ratio))), max(1, round(length * (1 + ratio))))


def random_requests(words: TokenWords, spec: RandomSpec, seed: int = 0) -> list[BenchRequest]:
    rng = random.Random(seed)
    requests = []
    for _ in range(spec.num_prompts):
        input_len = max(words.special_tokens + 1, _around(rng, spec.input_len, spec.range_ratio))
        prompt = words.text(rng, words.words_for(input_len))
        requests.append(BenchRequest(prompt, input_len, _around(rng, spec.output_len, spec.range_ratio)))
    return requests


@dataclass(frozen=True)
class SharedPrefixSpec:
    num_groups: int
    prompts_per_group: int
    system_len: int  # tokens of the shared system prompt, special tokens included
    question_len: int
    output_len: int


def shared_prefix_requests(words: TokenWords, spec: SharedPrefixSpec, seed: int = 0) -> list[BenchRequest]:
    """num_groups system prompts, each followed by prompts_per_group questions, in a shuffled order
    (so that requests of one group arrive spread out, as different users' would)."""
    rng = random.Random(seed)
    requests = []
    for _ in range(spec.num_groups):
        system_prompt = words.text(rng, words.words_for(spec.system_len))
        for _ in range(spec.prompts_per_group):
            prompt = system_prompt + words.text(rng, spec.question_len)
            requests.append(BenchRequest(prompt, spec.system_len + spec.question_len, spec.output_len, system_prompt))
    rng.shuffle(requests)
    return requests


@dataclass(frozen=True)
class TraceSpec:
    path: Path
    block_tokens: int = 512  # Mooncake's hash_ids each stand for 512 prompt tokens
    speedup: float = 1.0  # arrival times are divided by this
    max_requests: int | None = None


def trace_requests(words: TokenWords, spec: TraceSpec, seed: int = 0) -> list[BenchRequest]:
    """Mooncake trace lines ({"timestamp" ms, "input_length", "output_length", "hash_ids"}) as requests.
    Each hash id is one block of block_tokens words drawn from a generator seeded by the id, so equal ids
    give equal blocks; the prompt is its blocks in order, cut to input_length, or padded with words of
    its own when the blocks are fewer."""
    entries = [json.loads(line) for line in spec.path.read_text().splitlines() if line.strip()]
    entries = entries[: spec.max_requests]
    if not entries:
        raise ValueError(f"{spec.path} holds no trace entries")
    blocks: dict[int, str] = {}
    first_ms = min(entry["timestamp"] for entry in entries)
    requests = []
    for index, entry in enumerate(entries):
        hash_ids = entry.get("hash_ids", [])
        for hash_id in hash_ids:
            if hash_id not in blocks:
                blocks[hash_id] = words.text(random.Random(f"{seed}:{hash_id}"), spec.block_tokens)
        prompt_words = words.words_for(entry["input_length"])
        prompt = "".join(blocks[h] for h in hash_ids)
        # Every word carries its leading space, so cutting at the n-th space keeps exactly n words.
        cut = _word_offsets(prompt)
        if prompt_words < len(cut):
            prompt = prompt[: cut[prompt_words]]
        else:
            prompt += words.text(random.Random(f"{seed}:pad:{index}"), prompt_words - len(cut))
        arrival = (entry["timestamp"] - first_ms) / 1000.0 / spec.speedup
        requests.append(BenchRequest(prompt, entry["input_length"], entry["output_length"], arrival_s=arrival))
    return requests


def _word_offsets(text: str) -> list[int]:
    return [i for i, char in enumerate(text) if char == " "]
