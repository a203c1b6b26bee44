"""Prefill and decode node processes on the GPU behind the router, the KV moving through UCX's CUDA
transports (two processes on one GPU here; `--device cuda:0` / `cuda:1` on a two-GPU host): greedy
output equals the colocated engine's on the same GPU (skips without CUDA)."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from support.disaggregated_cluster import MODEL_NAME, DisaggregatedCluster, idle

from kvferry.engine import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MAX_TOKENS = 12
POOL_BYTES = 1 << 30  # each node's pool, explicit: two processes share the card


def _prefill_and_decode_devices() -> tuple[str, str]:
    return ("cuda:0", "cuda:1") if torch.cuda.device_count() > 1 else ("cuda:0", "cuda:0")


def test_disaggregated_nodes_on_the_gpu_match_the_colocated_engine(tiny_models):
    prefill_device, decode_device = _prefill_and_decode_devices()
    rng = random.Random(5)
    prompts = [[rng.randrange(1000) for _ in range(rng.randint(1, 300))] for _ in range(8)]
    llm = LLM(tiny_models["llama"], dtype="float32", device=decode_device, max_model_len=2048, kv_cache_bytes=POOL_BYTES)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    del llm
    torch.cuda.empty_cache()

    common = ["--dtype", "float32", "--kv-cache-bytes", str(POOL_BYTES), "--max-model-len", "2048"]
    # A decode node's lease must outlast the first prefills, which compile their Triton kernels (seconds, on a
    # machine with an empty Triton cache): with the test cluster's 2 s lease the reservations expired first,
    # the prefill node's transfers were refused (502) and the decode node prefilled those prompts itself.
    decode_flags = [*common, "--device", decode_device, "--lease", "60"]
    cluster = DisaggregatedCluster(
        tiny_models["llama"], use_redis=False,
        role_flags={"prefill": [*common, "--device", prefill_device], "decode": decode_flags},
    )
    try:
        body = {"model": MODEL_NAME, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}

        def complete(prompt: list[int]) -> list[int]:
            response = httpx.post(f"{cluster.router}/v1/completions", json={**body, "prompt": prompt}, timeout=120)
            assert response.status_code == 200, response.text
            return response.json()["choices"][0]["token_ids"]

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(complete, prompts)) == expected
        assert cluster.stats("prefill-0")["transfer"]["bytes_sent"] > 0
        assert cluster.metric("decode-0", "kvferry:local_prefills_total") == 0  # every prompt came over UCX
        assert idle(cluster.stats("prefill-0")) and idle(cluster.stats("decode-0"))
    finally:
        cluster.stop()
