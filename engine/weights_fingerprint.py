"""A short fingerprint of a checkpoint's weights: equal for the same weights, different for others.

Nodes publish it with their KV pool (kvcache/compatibility.py): two checkpoints of one architecture, a
model and its fine-tune, have the same shapes and file sizes, yet KV computed by one is not the other's,
so a decode node must not continue from a prefill node that runs the other. Hashing every byte would cost
seconds per GB at each start; a fine-tune changes every tensor, so sampled regions of each file (its
safetensors header, which names every tensor's dtype and shape, and evenly spaced chunks of its data) tell
checkpoints apart at the cost of a few MiB read.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kvferry.engine.weights import checkpoint_files

SAMPLES_PER_FILE = 16
SAMPLE_BYTES = 64 * 1024
HEADER_BYTES = 1024 * 1024  # the safetensors header sits at the start; the first sample covers it
DIGITS = 16


def weights_fingerprint(model_dir: Path) -> str:
    digest = hashlib.sha256((model_dir / "config.json").read_bytes())
    for path in checkpoint_files(model_dir):
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}".encode())
        with path.open("rb") as weights:
            digest.update(weights.read(HEADER_BYTES))
            for index in range(SAMPLES_PER_FILE):
                weights.seek(size * index // SAMPLES_PER_FILE)
                digest.update(weights.read(SAMPLE_BYTES))
            weights.seek(max(0, size - SAMPLE_BYTES))
            digest.update(weights.read(SAMPLE_BYTES))
    return digest.hexdigest()[:DIGITS]
