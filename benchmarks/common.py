"""Helpers the benchmark scripts share: environment facts, cached test checkpoints, result files."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

from kvferry.cache_dir import cache_dir

RESULTS = Path(__file__).resolve().parent / "results"
CACHE = cache_dir()


def environment() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def cached_model(arch: str, size: str, seed: int = 0, dtype: str = "float32") -> Path:
    """A make-model checkpoint, written once under the cache folder and reused by later runs."""
    from kvferry.engine.make_model import make_model

    folder = CACHE / "models" / f"{arch}-{size}-{dtype}-seed{seed}"
    if not (folder / "config.json").is_file():
        make_model(arch, size, folder, seed=seed, dtype=dtype)
    return folder


def write_results(name: str, payload: dict[str, object]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def print_table(rows: list[dict[str, object]], columns: list[str]) -> None:
    widths = [max(len(c), *(len(f"{r[c]}") for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for row in rows:
        print("  ".join(f"{row[c]}".ljust(w) for c, w in zip(columns, widths, strict=True)))
