import pytest
import torch

from kvferry.engine import SamplingParams

PROMPTS = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 20, 50)]


def test_seeded_sampling_reproduces_whatever_else_is_in_the_batch(tiny_models, make_llm):
    llm = make_llm(tiny_models["llama"], max_model_len=256)
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=24)
    alone = llm.generate(PROMPTS[0], seeded)[0].outputs[0].token_ids
    batched = llm.generate(PROMPTS, [seeded, SamplingParams(temperature=1.0, max_tokens=30), seeded])
    assert batched[0].outputs[0].token_ids == alone
    other_seed = SamplingParams(temperature=1.0, top_p=0.9, seed=99, max_tokens=24)
    assert llm.generate(PROMPTS[0], other_seed)[0].outputs[0].token_ids != alone


def test_top_k_one_equals_greedy(tiny_models, make_llm):
    llm = make_llm(tiny_models["qwen2"], max_model_len=256)
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    top1 = llm.generate(PROMPTS, SamplingParams(temperature=0.8, top_k=1, max_tokens=16, ignore_eos=True))
    assert [o.outputs[0].token_ids for o in top1] == [o.outputs[0].token_ids for o in greedy]


def test_extreme_top_k_and_top_p_are_greedy_and_keep_the_engine_alive(tiny_models, make_llm):
    """Found by schemathesis through the router: a top_k beyond int64 killed the engine, and a top_p
    below float32's range dropped every token."""
    llm = make_llm(tiny_models["qwen2"], max_model_len=256)
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    for extreme in (SamplingParams(temperature=0.8, top_p=1e-300, max_tokens=8, ignore_eos=True),
                    SamplingParams(temperature=0.8, top_k=2**70, top_p=1e-300, max_tokens=8, ignore_eos=True)):
        outputs = llm.generate(PROMPTS, extreme)
        assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in greedy]


def test_stop_string_ends_the_text_exactly_before_it(tiny_models, make_llm):
    llm = make_llm(tiny_models["llama"], max_model_len=256)
    free_run = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0].outputs[0]
    text = free_run.text
    # A stop string that straddles token boundaries: three characters from the middle of the text.
    middle = len(text) // 2
    stop = text[middle : middle + 3]
    assert len(stop) == 3
    stopped = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop]))
    completion = stopped[0].outputs[0]
    assert completion.finish_reason == "stop"
    assert completion.stop_reason == stop
    assert completion.text == text[: text.find(stop)]
    assert stop not in completion.text


def test_stop_token_ids_and_max_tokens(tiny_models, make_llm):
    llm = make_llm(tiny_models["qwen3"], max_model_len=256)
    run = llm.generate(PROMPTS[2], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].outputs[0]
    assert (len(run.token_ids), run.finish_reason) == (12, "length")
    stop_token = run.token_ids[5]
    stopped = llm.generate(PROMPTS[2], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_token]))
    completion = stopped[0].outputs[0]
    first = run.token_ids.index(stop_token)
    assert completion.token_ids == run.token_ids[: first + 1]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop_token)


def test_min_tokens_holds_back_every_end_as_transformers_does(tiny_models, make_llm):
    """min_tokens masks EOS and the stop_token_ids until the output has that many tokens, as transformers'
    min_new_tokens does: the greedy outputs agree token for token."""
    from transformers import AutoModelForCausalLM

    llm = make_llm(tiny_models["qwen3"], max_model_len=256)
    prompt = PROMPTS[2]["prompt_token_ids"]
    free = llm.generate(PROMPTS[2], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].outputs[0]
    stop_token = free.token_ids[1]
    early = llm.generate(PROMPTS[2], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_token]))[0].outputs[0]
    assert len(early.token_ids) <= 2 and early.finish_reason == "stop"
    held = llm.generate(PROMPTS[2], SamplingParams(temperature=0, max_tokens=12, min_tokens=6, stop_token_ids=[stop_token]))
    ours = held[0].outputs[0].token_ids
    assert len(ours) >= 6 and stop_token not in ours[:6]

    model = AutoModelForCausalLM.from_pretrained(tiny_models["qwen3"], dtype=torch.float32).eval()
    ends = [stop_token, *sorted(llm.engine.generation_defaults.eos_token_ids)]
    with torch.no_grad():
        reference = model.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=6, do_sample=False,
                                   eos_token_id=ends, pad_token_id=ends[0])
    assert ours == reference[0, len(prompt):].tolist()


def test_stop_strings_are_not_looked_for_before_min_tokens(tiny_models, make_llm):
    llm = make_llm(tiny_models["llama"], max_model_len=256)
    free = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].outputs[0]
    stop = free.text[:3]
    assert len(stop) == 3
    cut = llm.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop=[stop]))[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.text == ""
    held = SamplingParams(temperature=0, max_tokens=12, min_tokens=12, ignore_eos=True, stop=[stop])
    completion = llm.generate(PROMPTS[1], held)[0].outputs[0]
    assert (completion.token_ids, completion.text, completion.finish_reason) == (free.token_ids, free.text, "length")


def test_min_tokens_beyond_max_tokens_is_refused_by_name():
    with pytest.raises(ValueError, match="min_tokens must be in"):
        SamplingParams(max_tokens=4, min_tokens=5)


def test_n_returns_distinct_sequences_with_logprobs(tiny_models, make_llm):
    llm = make_llm(tiny_models["llama"], max_model_len=256)
    result = llm.generate(PROMPTS[1], SamplingParams(n=4, temperature=1.0, seed=5, max_tokens=10, logprobs=3))[0]
    assert [c.index for c in result.outputs] == [0, 1, 2, 3]
    assert len({tuple(c.token_ids) for c in result.outputs}) > 1
    for completion in result.outputs:
        assert len(completion.logprobs) == len(completion.token_ids)
        for token, entry in zip(completion.token_ids, completion.logprobs, strict=True):
            assert token in entry and 3 <= len(entry) <= 4
            assert all(value <= 0.0 for value in entry.values())


def test_penalties_change_the_output(tiny_models, make_llm):
    llm = make_llm(tiny_models["llama"], max_model_len=256)
    plain = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0].outputs[0]
    penalized = llm.generate(
        PROMPTS[0], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, frequency_penalty=2.0, repetition_penalty=1.5)
    )[0].outputs[0]
    assert penalized.token_ids != plain.token_ids
    # Heavy penalties make repeats rarer than in the unpenalized run.
    assert len(set(penalized.token_ids)) >= len(set(plain.token_ids))


def test_prompt_errors_name_the_problem(tiny_models, make_llm):
    llm = make_llm(tiny_models["llama"], max_model_len=64)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate({"prompt_token_ids": list(range(64))})
    with pytest.raises(ValueError, match="empty"):
        llm.generate({"prompt_token_ids": []})
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate({"prompt_token_ids": [10**9]})


def test_string_prompts_and_chat_template(tiny_models, make_llm):
    llm = make_llm(tiny_models["qwen2"], max_model_len=256)
    tokenizer = llm.engine.tokenizer
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Hello!"}])
    assert chat == "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    output = llm.generate(chat, SamplingParams(temperature=0, max_tokens=5))[0]
    assert output.prompt_token_ids == tokenizer.encode(chat)
    assert output.outputs[0].text == tokenizer.decode(output.outputs[0].token_ids)
