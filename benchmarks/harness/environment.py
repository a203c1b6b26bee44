"""The machine a result was measured on, and the test checkpoints benchmarks run on."""

from __future__ import annotations

import json
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


def long_context_copy(model_dir: Path, max_len: int) -> tuple[Path, str | None]:
    """The checkpoint with max_position_embeddings raised to `max_len` when it is lower (the `small`
    checkpoint says 4096, and the engine caps max_model_len there): same weights, linked, and only the
    config changed. Random weights make nothing of positions either way; the cost of a prefill does."""
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("max_position_embeddings", 0) >= max_len:
        return model_dir, None
    folder = model_dir.parent / f"{model_dir.name}-ctx{max_len}"
    folder.mkdir(parents=True, exist_ok=True)
    for path in model_dir.iterdir():
        link = folder / path.name
        if path.name != "config.json" and not link.exists():
            link.symlink_to(path)
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": max_len}, indent=2))
    return (
        folder,
        f"max_position_embeddings raised from {config.get('max_position_embeddings')} to {max_len} (same weights)",
    )
