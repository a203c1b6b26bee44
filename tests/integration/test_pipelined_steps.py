"""With decode graphs the engine queues step N+1 before it detokenizes step N (llm_engine.step). Checked on
the CPU through DecodeGraphs in eager mode: stop strings found after the next step was queued, stop tokens,
seeded sampling with n > 1 and logprobs give the plain engine's outputs, and an abort of a request whose
step is queued frees its blocks and ends its stream without another token."""

from __future__ import annotations

import random

import pytest

from kvferry.engine import SamplingParams
from kvferry.engine.cuda_graphs import DecodeGraphs


def _with_eager_graphs(llm) -> None:
    engine = llm.engine
    engine.runner.graphs = DecodeGraphs(
        engine.runner.model, engine.pool, [1, 2, 4, 8], engine.block_manager.blocks_for(engine.max_model_len), eager=True
    )


def _prompts(vocab_size: int, count: int) -> list[dict[str, list[int]]]:
    rng = random.Random(5)
    return [{"prompt_token_ids": [rng.randrange(vocab_size) for _ in range(rng.randrange(3, 30))]} for _ in range(count)]


def _summary(outputs) -> list[list[tuple]]:
    return [[(c.text, c.token_ids, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outputs]


def _logprobs(outputs) -> list[float]:
    """Every logprob in order; the token ids they belong to are compared through _summary."""
    return [v for o in outputs for c in o.outputs for step in c.logprobs or [] for v in step.values()]


def test_pipelined_steps_give_the_plain_engines_outputs(tiny_models, make_llm):
    plain = make_llm(tiny_models["llama"], max_model_len=256)
    prompts = _prompts(plain.engine.model_config.vocab_size, 6)
    free_run = plain.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    # Stop strings and a stop token taken from the middle of the free-running outputs, so they do fire.
    texts = [o.outputs[0].text for o in free_run]
    stop_text = next(t[len(t) // 2 : len(t) // 2 + 3] for t in texts if len(t.strip()) > 8)
    stop_token = free_run[1].outputs[0].token_ids[10]
    params = [
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop_text]),
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop_token_ids=[stop_token]),
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=20, seed=3, n=2, logprobs=2),
        SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop_text], logprobs=1),
        SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
    ]
    want_outputs = plain.generate(prompts, params)
    want = _summary(want_outputs)
    assert any(c[2] == "stop" and isinstance(c[3], str) for o in want for c in o), "no stop string fired"
    assert any(c[3] == stop_token for o in want for c in o), "the stop token never fired"

    pipelined = make_llm(tiny_models["llama"], max_model_len=256)
    _with_eager_graphs(pipelined)
    got_outputs = pipelined.generate(prompts, params)
    assert _summary(got_outputs) == want
    # Padding rows change the CPU matmuls' shapes, so logprobs may move in their last bits.
    assert _logprobs(got_outputs) == pytest.approx(_logprobs(want_outputs), rel=1e-4, abs=1e-5)
    assert pipelined.engine.runner.graphs.num_replays > 0


def test_abort_of_a_queued_step_frees_its_blocks(tiny_models, make_llm):
    llm = make_llm(tiny_models["llama"], max_model_len=256)
    _with_eager_graphs(llm)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    for index, prompt in enumerate(_prompts(engine.model_config.vocab_size, 3)):
        engine.add_request(str(index), prompt, params)
    for _ in range(4):
        engine.step()
    assert engine._pending is not None  # noqa: SLF001 - the next step is queued, holding request "1"
    aborted = engine.abort_request("1")
    tokens_at_abort = len(aborted.outputs[0].token_ids)
    finished = {}
    for _ in range(100):
        if not engine.has_unfinished_requests():
            break
        for output in engine.step():
            assert output.request_id != "1", "an aborted request got another output"
            if output.finished:
                finished[output.request_id] = output
    assert sorted(finished) == ["0", "2"]
    assert all(len(o.outputs[0].token_ids) == 30 for o in finished.values())
    assert aborted.outputs[0].finish_reason == "abort" and tokens_at_abort == 4


def test_steps_launched_ahead_give_the_plain_engines_outputs(tiny_models, make_llm):
    """Without logprobs every step whose batch can only repeat is launched before its tokens reach the host
    (their input tokens go from sample to graph on the device): stop tokens and stop strings that fire
    while such a step is queued, staggered length limits and seeded sampling give the plain engine's
    outputs, and every block is free afterwards."""
    plain = make_llm(tiny_models["llama"], max_model_len=256)
    prompts = _prompts(plain.engine.model_config.vocab_size, 6)
    free_run = plain.generate(prompts, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    texts = [o.outputs[0].text for o in free_run]
    stop_text = next(t[2 * len(t) // 3 : 2 * len(t) // 3 + 3] for t in texts if len(t.strip()) > 8)
    stop_token = free_run[2].outputs[0].token_ids[25]
    params = [
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop_text]),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop_token_ids=[stop_token]),
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=33, seed=3, n=2),
        SamplingParams(temperature=0, max_tokens=17, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop_text]),
    ]
    want = _summary(plain.generate(prompts, params))
    assert any(c[3] == stop_token for o in want for c in o), "the stop token never fired"

    pipelined = make_llm(tiny_models["llama"], max_model_len=256)
    _with_eager_graphs(pipelined)
    assert _summary(pipelined.generate(prompts, params)) == want
    graphs = pipelined.engine.runner.graphs
    assert graphs.num_fed_replays > graphs.num_replays // 2, f"{graphs.num_fed_replays} of {graphs.num_replays} launched ahead"
    assert pipelined.engine.allocator.check_integrity().in_use == 0
