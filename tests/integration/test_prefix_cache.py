import random

from kvferry.engine import SamplingParams


def test_shared_256_token_prefix_reuses_exactly_16_blocks(tiny_models, make_llm):
    llm = make_llm(tiny_models["llama"], block_size=16, max_model_len=1024)
    rng = random.Random(3)
    prefix = [rng.randrange(1000) for _ in range(256)]
    first = prefix + [rng.randrange(1000) for _ in range(20)]
    second = prefix + [rng.randrange(1000) for _ in range(37)]
    greedy = SamplingParams(temperature=0, max_tokens=8)

    out_first = llm.generate({"prompt_token_ids": first}, greedy)[0]
    assert out_first.num_cached_tokens == 0
    out_second = llm.generate({"prompt_token_ids": second}, greedy)[0]
    assert out_second.num_cached_tokens == 256  # 16 blocks of 16 tokens

    # The cached run gives the same tokens as a cold engine would.
    cold = make_llm(tiny_models["llama"], block_size=16, max_model_len=1024, enable_prefix_caching=False)
    assert cold.generate({"prompt_token_ids": second}, greedy)[0].outputs[0].token_ids == out_second.outputs[0].token_ids


def test_a_fully_cached_prompt_still_recomputes_its_last_token(tiny_models, make_llm):
    llm = make_llm(tiny_models["qwen3"], block_size=16, max_model_len=512)
    prompt = {"prompt_token_ids": list(range(10, 42))}  # exactly two blocks
    greedy = SamplingParams(temperature=0, max_tokens=4)
    first = llm.generate(prompt, greedy)[0]
    again = llm.generate(prompt, greedy)[0]
    assert again.num_cached_tokens == 16  # the second block holds the last token, so it is computed again
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
