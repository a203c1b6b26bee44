"""On the GPU the KV pool takes what the weights and the activation peak leave of gpu_memory_fraction,
and the weights are loaded onto the card (skips without CUDA)."""

from __future__ import annotations

import gc

import pytest
import torch

from kvferry.engine import LLM
from kvferry.engine.make_model import make_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

GiB = 1 << 30


@pytest.fixture(scope="module")
def small_bf16(tmp_path_factory):
    return make_model("llama", "small", tmp_path_factory.mktemp("mem") / "llama-small", seed=2, dtype="bfloat16")


@pytest.mark.parametrize("fraction", [0.3, 0.6])
def test_pool_fills_the_memory_fraction(small_bf16, fraction):
    gc.collect()
    torch.cuda.empty_cache()
    llm = LLM(small_bf16, dtype="bfloat16", device="cuda", max_model_len=1024, gpu_memory_fraction=fraction)
    free, total = torch.cuda.mem_get_info()
    used = total - free
    pool_bytes = llm.engine.pool.tensor.numel() * llm.engine.pool.tensor.element_size()
    print(f"\nfraction {fraction}: pool {pool_bytes / GiB:.1f} GiB, card in use {used / GiB:.1f} of {total / GiB:.1f} GiB")
    assert used <= fraction * total
    # All but the measured activation peak, the 1 GiB graph reserve and the graphs' own memory went to the pool.
    assert used >= fraction * total - 3 * GiB
    assert pool_bytes > 0.9 * (fraction * total - (used - pool_bytes) - 3 * GiB)


def test_weights_live_on_the_card(small_bf16):
    llm = LLM(small_bf16, dtype="bfloat16", device="cuda", max_model_len=256, kv_cache_bytes=GiB // 4)
    weights = llm.engine.runner.model.weights
    tensors = [weights.embed_tokens, weights.lm_head, *(t for layer in weights.layers for t in (layer.qkv, layer.down))]
    assert all(t.is_cuda and t.dtype == torch.bfloat16 for t in tensors)
