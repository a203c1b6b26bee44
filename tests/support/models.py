"""Tiny random-weight checkpoints of each family, written once per test session (fixture `tiny_models`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kvferry.engine.make_model import ARCHS, make_model


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {arch: make_model(arch, "tiny", root / arch, seed=1) for arch in ARCHS}
