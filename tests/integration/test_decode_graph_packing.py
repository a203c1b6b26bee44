"""The decode-graph path's packing (static buffers, padding up to a captured size, null-block padding
rows) checked on the CPU: DecodeGraphs in eager mode runs the same forward over the same buffers that the
CUDA graphs replay, and greedy output must equal the plain engine's token for token."""

from __future__ import annotations

import random

import pytest

from kvferry.engine import SamplingParams
from kvferry.engine.cuda_graphs import DecodeGraphs


def _prompts(vocab_size: int, count: int) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(vocab_size) for _ in range(rng.randrange(1, 40))] for _ in range(count)]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_padded_decode_batches_match_the_eager_engine(arch, tiny_models, make_llm):
    plain = make_llm(tiny_models[arch], max_model_len=256)
    prompts = _prompts(plain.engine.model_config.vocab_size, 7)
    # Different lengths, so the decode batch shrinks from 7 to 1 as requests finish.
    params = [SamplingParams(temperature=0, max_tokens=6 + 4 * i, ignore_eos=True) for i in range(len(prompts))]
    expected = [o.outputs[0].token_ids for o in plain.generate([{"prompt_token_ids": p} for p in prompts], params)]

    llm = make_llm(tiny_models[arch], max_model_len=256)
    engine = llm.engine
    # Sizes 2 and 8 only: batches of 7 down to 1 pad up, and a batch of 3 pads by five rows.
    engine.runner.graphs = DecodeGraphs(
        engine.runner.model, engine.pool, [2, 8], engine.block_manager.blocks_for(engine.max_model_len), eager=True
    )
    replayed = []
    fed = []  # per replay: did its input tokens come from the previous step's samples on the device
    replay = engine.runner.graphs.replay

    def counting_replay(step_inputs, block_tables, feedback=None):
        replayed.append((step_inputs.shape[1], block_tables.shape[0]))
        fed.append(feedback is not None)
        return replay(step_inputs, block_tables, feedback)

    engine.runner.graphs.replay = counting_replay
    got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    assert got == expected
    assert {(8, 7), (8, 3), (2, 1)} <= set(replayed)  # padded by one, five and one rows
    # Steps launched ahead (tokens fed on the device) and steps after a request finished (tokens from the host).
    assert any(fed) and not all(fed)
