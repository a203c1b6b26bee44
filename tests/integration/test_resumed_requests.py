"""A completion resumed on another engine after its first node died mid-stream (the router's migration):
given the prompt and the tokens the client already has, the second engine's outputs are exactly the rest of
the undisturbed completion, token for token and character for character, greedy or seeded."""

from __future__ import annotations

import pytest

from kvferry.engine import CompletionOutput, LLMEngine, SamplingParams

PROMPT = {"prompt_token_ids": list(range(7, 40))}
CUT = 9  # tokens the client had when the first node died
MAX_TOKENS = 30
# A stop string that never matches still holds back its length - 1 characters from every streamed delta:
# the client has seen less text than the first node's detokenizer held.
UNMATCHED_STOP = "@#@#"

CASES = {
    "greedy": SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
    "seeded": SamplingParams(temperature=1.0, top_p=0.95, seed=77, max_tokens=MAX_TOKENS, ignore_eos=True),
    "seeded_penalised_held_back": SamplingParams(
        temperature=0.9, top_k=40, seed=5, frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=1.2,
        stop=[UNMATCHED_STOP], max_tokens=MAX_TOKENS, ignore_eos=True,
    ),
}


def _stream(engine: LLMEngine, request_id: str) -> list[CompletionOutput]:
    """Every output of one request, step by step, as a node streams them."""
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [output.outputs[0] for output in engine.step() if output.request_id == request_id]
    return outputs


@pytest.mark.parametrize("case", list(CASES))
def test_a_resumed_completion_is_the_rest_of_the_undisturbed_one(tiny_models, make_llm, case):
    params = CASES[case]
    first_node = make_llm(tiny_models["llama"], max_model_len=256).engine
    first_node.add_request("undisturbed", PROMPT, params)
    outputs = _stream(first_node, "undisturbed")
    undisturbed = outputs[-1]
    assert len(undisturbed.token_ids) == MAX_TOKENS and UNMATCHED_STOP not in undisturbed.text
    seen = next(o for o in outputs if len(o.token_ids) == CUT)  # what the client had received

    second_node = make_llm(tiny_models["llama"], max_model_len=256).engine
    second_node.add_request("resumed", PROMPT, params, resumed=seen.token_ids)
    rest = _stream(second_node, "resumed")[-1]
    assert seen.token_ids + rest.token_ids == undisturbed.token_ids
    assert seen.text + rest.text == undisturbed.text
    assert rest.finish_reason == undisturbed.finish_reason == "length"
    if case == "seeded_penalised_held_back":
        assert len(seen.text) < len(first_node.tokenizer.decode(seen.token_ids))  # text really was held back


def test_resumed_tokens_that_leave_nothing_to_generate_are_refused(tiny_models, make_llm):
    engine = make_llm(tiny_models["llama"], max_model_len=256).engine
    with pytest.raises(ValueError, match="max_tokens"):
        engine.add_request("done", PROMPT, SamplingParams(max_tokens=3), resumed=[11, 12, 13])
    with pytest.raises(ValueError, match="n == 1"):
        engine.add_request("two", PROMPT, SamplingParams(n=2, max_tokens=8), resumed=[11])
    assert not engine.has_unfinished_requests()
