"""Checkpoint formats and dtypes the engine loads."""

from __future__ import annotations

import json

import pytest

from kvferry.engine import SamplingParams, UnsupportedModelError
from kvferry.engine.make_model import make_model

PROMPT = {"prompt_token_ids": list(range(20, 60))}
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def test_sharded_checkpoint_with_index_loads_the_same_weights(tmp_path, tiny_models, make_llm):
    sharded = make_model("llama", "tiny", tmp_path / "sharded", seed=1, num_shards=3)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    want = make_llm(tiny_models["llama"], max_model_len=256).generate(PROMPT, GREEDY)[0].outputs[0].token_ids
    assert make_llm(sharded, max_model_len=256).generate(PROMPT, GREEDY)[0].outputs[0].token_ids == want


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs_and_mostly_agrees_with_float32(dtype, tiny_models, make_llm):
    want = make_llm(tiny_models["qwen2"], max_model_len=256).generate(PROMPT, GREEDY)[0].outputs[0].token_ids
    got = make_llm(tiny_models["qwen2"], dtype=dtype, max_model_len=256).generate(PROMPT, GREEDY)[0].outputs[0].token_ids
    assert len(got) == 12
    assert got[:4] == want[:4]  # rounding may flip a later near-tie; the first tokens must agree


def test_unsupported_architecture_in_a_folder_is_named(tmp_path, tiny_models, make_llm):
    folder = make_model("llama", "tiny", tmp_path / "odd")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["FalconForCausalLM"]}))
    with pytest.raises(UnsupportedModelError, match="FalconForCausalLM"):
        make_llm(folder)


def test_written_weights_are_readable_by_other_users(tmp_path):
    # The image's pods run as a non-root user and read model folders written by root (a hostPath volume).
    from kvferry.engine.make_model import make_model

    folder = tmp_path / "model"
    make_model("llama", "tiny", folder)
    for weights in folder.glob("*.safetensors"):
        assert weights.stat().st_mode & 0o044 == 0o044, oct(weights.stat().st_mode)
