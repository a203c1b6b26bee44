"""Structured outputs in the engine (engine/grammar.py): a grammar's token mask holds every sequence of a
request to it, greedy or sampled, in a batch with free sequences, across a resume. The tiny random models
write nothing meaningful, so the grammars here bound every string: what is checked is the form."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Literal

import pytest
import torch
from pydantic import BaseModel, Field

from kvferry.engine import SamplingParams
from kvferry.engine.grammar import GrammarCompiler, mask_disallowed
from kvferry.engine.grammar_backends import uses_llguidance
from kvferry.engine.sampling_params import Grammar

PROMPT = {"prompt_token_ids": list(range(5, 45))}


class Reading(BaseModel):
    unit: Literal["celsius", "kelvin"]
    value: int = Field(ge=-40, le=500)
    ok: bool
    tags: list[Literal["indoor", "outdoor", "lab"]] = Field(max_length=3)


READING = Grammar("json_schema", json.dumps(Reading.model_json_schema()))


class Label(BaseModel):
    """Length-bounded free strings: the schemas llguidance holds (engine/grammar_backends.py)."""

    name: str = Field(min_length=1, max_length=8)
    note: str = Field(max_length=5)
    count: int = Field(ge=0, le=9)


LABEL = Grammar("json_schema", json.dumps(Label.model_json_schema()))


@pytest.fixture(scope="module")
def llm(tiny_models):
    from kvferry.engine import LLM

    engine = LLM(tiny_models["qwen2"], dtype="float32", max_model_len=512)
    yield engine
    assert engine.engine.allocator.check_integrity().in_use == 0


def _completions(llm, params: SamplingParams, prompt: dict = PROMPT) -> list:
    return llm.generate(prompt, params)[0].outputs


def test_a_json_schema_holds_greedy_and_sampled_choices(llm):
    greedy = _completions(llm, SamplingParams(temperature=0, max_tokens=120, grammar=READING))[0]
    assert greedy.finish_reason == "stop", greedy
    Reading.model_validate_json(greedy.text)
    sampled = _completions(llm, SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=120, grammar=READING))
    for completion in sampled:
        assert completion.finish_reason == "stop", completion
        Reading.model_validate_json(completion.text)
    assert len({c.text for c in sampled}) > 1  # the mask narrows the draws, it does not make them one


def test_regex_choice_and_json_object(llm):
    code = _completions(llm, SamplingParams(temperature=0.9, seed=1, max_tokens=20,
                                            grammar=Grammar("regex", r"[A-Z]{2}-[0-9]{3}")))[0]
    assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", code.text) and code.finish_reason == "stop", code
    options = ["yes", "no", "maybe later"]
    chosen = _completions(llm, SamplingParams(temperature=1.0, seed=2, max_tokens=20,
                                              grammar=Grammar("choice", json.dumps(options))))[0]
    assert chosen.text in options and chosen.finish_reason == "stop", chosen
    anything = _completions(llm, SamplingParams(temperature=0, max_tokens=200, grammar=Grammar("json_object")))[0]
    if anything.finish_reason == "stop":  # a random model may write one long string to the end of its budget
        assert isinstance(json.loads(anything.text), dict)
    else:
        assert anything.text.startswith("{")


def test_grammar_rows_and_free_rows_share_a_batch(llm):
    free = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    alone = _completions(llm, free)[0].token_ids
    batch = llm.generate([PROMPT, PROMPT], [free, SamplingParams(temperature=0, max_tokens=120, grammar=READING)])
    assert batch[0].outputs[0].token_ids == alone  # the mask touches its own row only
    Reading.model_validate_json(batch[1].outputs[0].text)


def test_the_mask_forbids_what_each_rows_matcher_forbids_and_nothing_else(llm):
    """mask_disallowed's batched fill and byte-wise bias against each matcher's own row, unpacked bit by bit."""
    engine = llm.engine
    vocab = engine.model_config.vocab_size
    compiler = GrammarCompiler(engine.tokenizer.tokenizer, vocab, engine.generation_defaults.eos_token_ids)
    matchers = [None, compiler.matcher(LABEL), compiler.matcher(READING), None, compiler.matcher(LABEL)]
    moved = matchers[4]  # one matcher a token further on, so that its row differs from row 1's
    own = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
    moved.fill(own, 0)
    assert moved.accept_token(int(_allowed(own, vocab).nonzero()[0]))
    logits = torch.randn(len(matchers), vocab)
    masked = logits.clone()
    mask_disallowed(masked, [SimpleNamespace(grammar=matcher) for matcher in matchers])
    for row, matcher in enumerate(matchers):
        if matcher is None:
            assert torch.equal(masked[row], logits[row])
            continue
        matcher.fill(own, 0)
        allowed = _allowed(own, vocab)
        assert 0 < int(allowed.sum()) < vocab
        assert torch.equal(masked[row], logits[row].where(allowed, float("-inf"))), row


def _allowed(bitmask_row: torch.Tensor, vocab: int) -> torch.Tensor:
    return ((bitmask_row[0].unsqueeze(1) >> torch.arange(32)) & 1).flatten()[:vocab].bool()


def test_which_library_holds_a_schema():
    assert uses_llguidance(LABEL)
    assert not uses_llguidance(READING)  # bounded arrays and numbers, enums: xgrammar's
    patterned = {"type": "object", "properties": {"id": {"type": "string", "maxLength": 4, "pattern": "^[a-z]+$"}}}
    assert not uses_llguidance(Grammar("json_schema", json.dumps(patterned)))  # a pattern bounds the characters
    nested = {"type": "array", "items": {"anyOf": [{"type": "string", "minLength": 2}, {"type": "null"}]}}
    assert uses_llguidance(Grammar("json_schema", json.dumps(nested)))
    assert not uses_llguidance(Grammar("regex", "[a-z]{1,5}"))


def test_a_length_bounded_schema_holds_in_a_batch_with_the_other_library_and_free_rows(llm):
    free = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    alone = _completions(llm, free)[0].token_ids
    label = SamplingParams(temperature=0, max_tokens=120, grammar=LABEL)
    label_alone = _completions(llm, label)[0]
    sampled = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=120, grammar=LABEL)
    batch = llm.generate([PROMPT] * 4, [free, label, SamplingParams(temperature=0, max_tokens=120, grammar=READING),
                                        sampled])
    assert batch[0].outputs[0].token_ids == alone
    assert batch[1].outputs[0].text == label_alone.text  # a batch does not change a greedy constrained row
    Reading.model_validate_json(batch[2].outputs[0].text)
    for completion in [label_alone, *batch[3].outputs]:
        assert completion.finish_reason == "stop", completion
        parsed = Label.model_validate_json(completion.text)
        # compact JSON with the same separators as xgrammar's: whichever library, one output form
        assert completion.text == json.dumps(parsed.model_dump()), completion.text


def test_a_resumed_sequence_continues_its_grammar(llm):
    """A stream migrated after k tokens: its matcher takes the k tokens again and the rest is what the
    undisturbed run wrote."""
    params = SamplingParams(temperature=0, max_tokens=120, grammar=READING)
    whole = _completions(llm, params)[0]
    resumed = llm.engine
    resumed.add_request("resumed", PROMPT, params, resumed=whole.token_ids[:5])
    outputs = []
    while resumed.has_unfinished_requests():
        outputs += [o for o in resumed.step() if o.request_id == "resumed"]
    assert outputs[-1].outputs[0].token_ids == whole.token_ids[5:]


def test_what_does_not_compile_is_refused_by_name(llm):
    with pytest.raises(ValueError, match="json_schema grammar does not compile"):
        llm.generate(PROMPT, SamplingParams(max_tokens=4, grammar=Grammar("json_schema", '{"type": "no-such-type"}')))
    bounded_but_broken = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}, "b": {"type": "x"}}}
    with pytest.raises(ValueError, match="json_schema grammar does not compile"):  # llguidance's refusal
        llm.generate(PROMPT, SamplingParams(max_tokens=4, grammar=Grammar("json_schema", json.dumps(bounded_but_broken))))
    with pytest.raises(ValueError, match="choice grammar's spec is a JSON list"):
        SamplingParams(grammar=Grammar("choice", '"yes"'))
    with pytest.raises(ValueError, match="not JSON"):
        SamplingParams(grammar=Grammar("json_schema", "{not json"))
    with pytest.raises(ValueError, match="min_tokens cannot be combined with a grammar"):
        SamplingParams(max_tokens=8, min_tokens=2, grammar=READING)
