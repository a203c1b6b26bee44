"""The weights' fingerprint: the same checkpoint anywhere gives one, a fine-tune of it (same shapes, same
sizes, other values) another."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from kvferry.engine.weights_fingerprint import weights_fingerprint


def _checkpoint(folder: Path, seed: int) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    generator = torch.Generator().manual_seed(seed)
    save_file({f"layer.{i}": torch.randn(256, 256, generator=generator) for i in range(8)},
              str(folder / "model.safetensors"))
    return folder


def test_a_copy_has_the_same_fingerprint_and_a_fine_tune_another(tmp_path: Path):
    base = _checkpoint(tmp_path / "base", seed=0)
    copy = shutil.copytree(base, tmp_path / "copy")
    tuned = _checkpoint(tmp_path / "tuned", seed=1)
    assert (base / "model.safetensors").stat().st_size == (tuned / "model.safetensors").stat().st_size
    assert weights_fingerprint(base) == weights_fingerprint(copy)
    assert weights_fingerprint(base) != weights_fingerprint(tuned)
