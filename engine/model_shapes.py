"""The shapes `kvferry make-model --size` writes. Kept apart from make_model so the CLI can list them
without importing torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int = 4096
    vocab_size: int | None = None  # None: the trained tokenizer's; larger ids decode to nothing
    rope_original_context: int = 1024  # Llama-3.1 rope scaling's original_max_position_embeddings


SIZES: dict[str, ModelShape] = {
    "tiny": ModelShape(hidden_size=128, intermediate_size=256, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32),
    "small": ModelShape(hidden_size=768, intermediate_size=2048, num_layers=12, num_heads=12, num_kv_heads=4, head_dim=64),
    # Llama-3.1-8B's shapes (about 8.0e9 parameters, 16 GB in bfloat16) for GPU benchmarks: every matmul,
    # the KV size per token and the lm_head are the real model's, so the timings are too.
    "8b-shape": ModelShape(hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8,
                           head_dim=128, max_position_embeddings=131072, vocab_size=128256,
                           rope_original_context=8192),  # fmt: skip
}
