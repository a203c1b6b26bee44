"""Tiny random-weight checkpoints of each family, written once per test session (fixture `tiny_models`), and the
greedy reference answers of the tiny llama (fixture `tiny_llama_greedy`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kvferry.engine import LLM, SamplingParams
from kvferry.engine.make_model import ARCHS, make_model


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {arch: make_model(arch, "tiny", root / arch, seed=1) for arch in ARCHS}


GreedyReference = Callable[[list[list[int]], int], list[list[int]]]


@pytest.fixture(scope="session")
def tiny_llama_greedy(tiny_models: dict[str, Path]) -> GreedyReference:
    """greedy(prompts, max_tokens): the colocated engine's greedy token ids on the tiny llama, the answer every
    cluster must give (the engine itself equals transformers token for token: tests/integration/test_engine_parity.py).
    One engine for the session: loading it per call cost each fault test seconds."""
    llm = LLM(tiny_models["llama"], dtype="float32", max_model_len=2048)

    def greedy(prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        return [output.outputs[0].token_ids for output in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]

    return greedy
