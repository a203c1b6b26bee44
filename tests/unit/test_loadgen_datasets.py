"""Benchmark datasets: exact token counts, shared prefixes that really are shared, trace hash ids honoured."""

from __future__ import annotations

import json

import pytest

from kvferry.engine.tokenizer import ModelTokenizer
from kvferry.loadgen.datasets import (
    RandomSpec,
    SharedPrefixSpec,
    TokenWords,
    TraceSpec,
    random_requests,
    shared_prefix_requests,
    trace_requests,
)


@pytest.fixture(scope="module", params=["llama", "qwen2"])  # llama adds a BOS token, qwen2 adds none
def tokenizer(request, tiny_models) -> ModelTokenizer:
    return ModelTokenizer(tiny_models[request.param])


@pytest.fixture(scope="module")
def words(tokenizer) -> TokenWords:
    return TokenWords(tokenizer)


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def test_random_prompts_have_exactly_the_drawn_token_counts(tokenizer, words):
    requests = random_requests(words, RandomSpec(num_prompts=20, input_len=100, output_len=30, range_ratio=0.5), seed=3)
    assert len(requests) == 20
    for request in requests:
        assert len(tokenizer.encode(request.prompt)) == request.input_tokens
        assert 50 <= request.input_tokens <= 150 and 15 <= request.output_tokens <= 45
    assert len({r.input_tokens for r in requests}) > 5  # the range ratio spreads them


def test_random_prompts_without_a_range_are_all_one_length(tokenizer, words):
    requests = random_requests(words, RandomSpec(num_prompts=5, input_len=77, output_len=9))
    assert [len(tokenizer.encode(r.prompt)) for r in requests] == [77] * 5
    assert [r.output_tokens for r in requests] == [9] * 5
    assert len({r.prompt for r in requests}) == 5


def test_shared_prefix_groups_share_exactly_their_system_prompt(tokenizer, words):
    spec = SharedPrefixSpec(num_groups=3, prompts_per_group=4, system_len=64, question_len=16, output_len=8)
    requests = shared_prefix_requests(words, spec, seed=1)
    assert len(requests) == 12
    groups: dict[str, list[list[int]]] = {}
    for request in requests:
        tokens = tokenizer.encode(request.prompt)
        assert len(tokens) == request.input_tokens == 80
        assert request.prompt.startswith(request.system_prompt)
        assert len(tokenizer.encode(request.system_prompt)) == 64
        groups.setdefault(request.system_prompt, []).append(tokens)
    assert sorted(len(g) for g in groups.values()) == [4, 4, 4]
    for members in groups.values():
        for other in members[1:]:
            assert _common_prefix(members[0], other) >= 64  # the whole system prompt, token for token
    firsts = [members[0] for members in groups.values()]
    assert _common_prefix(firsts[0], firsts[1]) < 64 - 8  # different groups do not share it
    order = [r.system_prompt for r in requests]
    assert order != sorted(order, key=order.index)  # shuffled: one group's requests are not back to back


def test_trace_prompts_follow_hash_ids_block_by_block(tmp_path, tokenizer, words):
    block = 32
    entries = [
        {"timestamp": 1000, "input_length": 96, "output_length": 5, "hash_ids": [7, 8, 9]},
        {"timestamp": 1500, "input_length": 80, "output_length": 6, "hash_ids": [7, 8, 10]},  # ends in a partial block
        {"timestamp": 3000, "input_length": 100, "output_length": 7, "hash_ids": [11]},  # longer than its blocks
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in entries) + "\n")
    requests = trace_requests(words, TraceSpec(path, block_tokens=block, speedup=2.0))
    tokens = [tokenizer.encode(r.prompt) for r in requests]
    assert [len(t) for t in tokens] == [r.input_tokens for r in requests] == [96, 80, 100]
    assert [r.output_tokens for r in requests] == [5, 6, 7]
    assert [r.arrival_s for r in requests] == [0.0, 0.25, 1.0]
    shared = _common_prefix(tokens[0], tokens[1])
    special = words.special_tokens
    assert 2 * block <= shared < 2 * block + special + 4  # blocks 7 and 8 shared, block 9 and 10 differ
    assert _common_prefix(tokens[0], tokens[2]) < special + 4
    again = trace_requests(words, TraceSpec(path, block_tokens=block))
    assert [r.prompt for r in again] == [r.prompt for r in requests]  # equal ids, equal blocks, every time


def test_trace_block_content_depends_only_on_its_hash_id(tmp_path, words):
    path = tmp_path / "trace.jsonl"
    special = words.special_tokens
    lines = [{"timestamp": 0, "input_length": 32 + special, "output_length": 1, "hash_ids": [5]},
             {"timestamp": 0, "input_length": 64 + special, "output_length": 1, "hash_ids": [4, 5]}]
    path.write_text("\n".join(json.dumps(e) for e in lines))
    first, second = trace_requests(words, TraceSpec(path, block_tokens=32))
    first_words, second_words = first.prompt.split(" ")[1:], second.prompt.split(" ")[1:]
    assert len(first_words) == 32 and len(second_words) == 64
    assert second_words[32:] == first_words  # block 5 is the same words after block 4 as at the start


def test_too_short_prompts_are_refused(words):
    with pytest.raises(ValueError, match="special tokens"):
        words.words_for(words.special_tokens)
