"""`kvferry up` with real processes: redis-server, prefill and decode nodes over UCX, and the router.
Greedy output through P -> D equals the colocated engine's, alone and under concurrent load."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from support.redis_server import free_port

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def cluster(tiny_models):
    port = free_port()
    args = [sys.executable, "-m", "kvferry", "up", "--model", str(tiny_models["llama"]), "--prefill", "2", "--decode", "2", "--port", str(port)]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    nodes: dict[str, str] = {}
    deadline = time.monotonic() + 240
    for line in process.stdout:  # type: ignore[union-attr]
        if match := re.match(r"\s+(\S+) ready at (\S+)", line):
            nodes[match[1]] = match[2]
        if "is up at" in line or time.monotonic() > deadline:
            break
    assert "router" in nodes, f"cluster did not come up: {nodes}"
    yield process, nodes
    os.killpg(process.pid, signal.SIGINT)
    try:
        assert process.wait(timeout=45) == 0  # kvferry up gives its children 8 s, then kills them
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    for url in nodes.values():  # every node is gone with it
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/health", timeout=1)


def _complete(router: str, prompt_ids: list[int]) -> dict:
    body = {"model": "llama", "prompt": prompt_ids, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    response = httpx.post(f"{router}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_disaggregated_greedy_output_equals_colocated_under_load(cluster, tiny_llama_greedy):
    _, nodes = cluster
    rng = random.Random(4)
    prompts = [[rng.randrange(1000) for _ in range(rng.randint(1, 120))] for _ in range(12)]
    expected = tiny_llama_greedy(prompts, MAX_TOKENS)
    assert _complete(nodes["router"], prompts[0])["choices"][0]["token_ids"] == expected[0]  # one alone
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: _complete(nodes["router"], p), prompts))
    assert [r["choices"][0]["token_ids"] for r in results] == expected
    assert all(r["usage"]["completion_tokens"] == MAX_TOKENS for r in results)
    for name in ("prefill-0", "prefill-1", "decode-0", "decode-1"):
        stats = httpx.get(f"{nodes[name]}/stats").json()
        assert stats["blocks"]["in_use"] == 0 and stats["reserved"] == 0 and stats["held_kv"] == 0, (name, stats)
    assert sum(httpx.get(f"{nodes[n]}/stats").json()["transfer"]["bytes_sent"] for n in ("prefill-0", "prefill-1")) > 0
    assert httpx.get(f"{nodes['router']}/stats").json()["local_prefill_fallbacks"] == 0


def test_streaming_returns_sse_chunks_and_done(cluster, tiny_models):
    _, nodes = cluster
    body = {"model": "llama", "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{nodes['router']}/v1/completions", json=body, timeout=60) as response:
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert [chunk["choices"][0]["finish_reason"] for chunk in chunks] == [None, None, None, "length"]


def test_bad_requests_are_refused_before_any_node(cluster):
    _, nodes = cluster
    router = nodes["router"]
    assert httpx.post(f"{router}/v1/completions", json={"model": "llama", "prompt": "x", "max_tokens": 0}).status_code == 400
    unknown = httpx.post(f"{router}/v1/completions", json={"model": "nope", "prompt": "x"})
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
