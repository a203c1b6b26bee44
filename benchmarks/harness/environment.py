"""The machine a result was measured on, and the test checkpoints benchmarks run on."""

from __future__ import annotations

import platform
from pathlib import Path

from kvferry.cache_dir import cache_dir

CACHE = cache_dir()


def environment() -> dict[str, object]:
    """Python, torch, torch's CPU threads, the machine, and the CUDA GPU's name (None without one)."""
    import torch  # here, not at import: `kvferry bench --list` and the schema tests load no torch

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
