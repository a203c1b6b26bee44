"""Engine fixtures: tiny checkpoints written once per session, and LLMs whose allocator is checked after
every test (free + cached + in use == total, nothing left in use)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvferry.engine import LLM
from kvferry.engine.make_model import ARCHS, make_model


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {arch: make_model(arch, "tiny", root / arch, seed=1) for arch in ARCHS}


@pytest.fixture
def make_llm():
    created: list[LLM] = []

    def factory(model_dir: Path, **engine_args) -> LLM:
        llm = LLM(model_dir, dtype=engine_args.pop("dtype", "float32"), **engine_args)
        created.append(llm)
        return llm

    yield factory
    for llm in created:
        stats = llm.engine.allocator.check_integrity()
        assert stats.in_use == 0, f"blocks still in use after the test: {stats}"
