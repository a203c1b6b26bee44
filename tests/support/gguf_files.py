"""Small GGUF files written with gguf.GGUFWriter, for the import's error paths: no download needed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kvferry.engine.make_model import train_tokenizer

HIDDEN, LAYERS, HEADS, FFN = 64, 2, 4, 128


def write_tiny_gguf(path: Path, arch: str = "llama", with_tokenizer: bool = True) -> Path:
    """A random-weight model of `arch` with llama's tensor names and the tiny checkpoint's BPE tokenizer."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    vocab_size = 2048
    if with_tokenizer:
        model = json.loads(train_tokenizer("qwen2").to_str())["model"]
        tokens = sorted(model["vocab"], key=model["vocab"].get)
        vocab_size = len(tokens)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
        writer.add_eos_token_id(0)
    rng = np.random.default_rng(0)

    def tensor(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    writer.add_tensor("token_embd.weight", tensor(vocab_size, HIDDEN))
    for i in range(LAYERS):
        for name, shape in (("attn_norm", (HIDDEN,)), ("attn_q", (HIDDEN, HIDDEN)), ("attn_k", (HIDDEN, HIDDEN)),
                            ("attn_v", (HIDDEN, HIDDEN)), ("attn_output", (HIDDEN, HIDDEN)), ("ffn_norm", (HIDDEN,)),
                            ("ffn_gate", (FFN, HIDDEN)), ("ffn_up", (FFN, HIDDEN)), ("ffn_down", (HIDDEN, FFN))):
            writer.add_tensor(f"blk.{i}.{name}.weight", tensor(*shape))
    writer.add_tensor("output_norm.weight", tensor(HIDDEN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
