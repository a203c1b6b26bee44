"""Nodes that fail on purpose (support.faulty_node): an engine failing on a decode node ends the
requests it held with a 500 or an error event then [DONE], the node reports unhealthy, and new traffic
avoids it; a prefill node dying between its prefill and the transfer leaves the request to the decode
node's local prefill, with the same greedy tokens and no blocks left behind."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis
from support.disaggregated_cluster import MODEL_NAME, DisaggregatedCluster

LONG = 1500  # long enough that the stream still runs when the second request arrives, however loaded
SHORT = 8


@pytest.fixture
def cluster(tiny_models):
    # decode-0's engine dies on the first step with two requests in its batch.
    faulty = {"decode-0": ["-m", "support.faulty_node", "--fail-when-running", "2"]}
    cluster = DisaggregatedCluster(
        tiny_models["llama"], num_decode=2, launchers=faulty, router_flags=["--policy", "round_robin"]
    )
    yield cluster
    cluster.stop()


def _body(seed: int, stream: bool, max_tokens: int) -> dict:
    prompt = [(seed * 31 + i * 7) % 1000 for i in range(24)]
    return {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream}


def _call(router: str, body: dict) -> tuple[int, list[str] | dict]:
    if not body["stream"]:
        response = httpx.post(f"{router}/v1/completions", json=body, timeout=60)
        return response.status_code, response.json()
    with httpx.stream("POST", f"{router}/v1/completions", json=body, timeout=60) as response:
        return response.status_code, [line for line in response.iter_lines() if line]


def _completed(result: tuple[int, list[str] | dict], max_tokens: int) -> bool:
    status, payload = result
    if isinstance(payload, dict):
        return status == 200 and payload["usage"]["completion_tokens"] == max_tokens
    chunks = [json.loads(line[6:]) for line in payload if line.startswith("data: {")]
    return status == 200 and payload[-1] == "data: [DONE]" and chunks[-1].get("choices", [{}])[0].get("finish_reason") == "length"


def test_requests_on_the_failed_engine_get_errors_and_the_node_gets_no_new_traffic(cluster):
    # A second router that sees only decode-0 puts a stream and a plain request on it together.
    only_faulty = cluster.add_router("router-faulty", ["prefill-0", "decode-0"], [])
    with ThreadPoolExecutor(2) as pool:
        streamed = pool.submit(_call, only_faulty, _body(1, True, LONG))
        cluster.wait_until(lambda: cluster.stats("decode-0")["running"] == 1, 30,
                           lambda: f"the stream runs on decode-0: {cluster.stats('decode-0')} {cluster.stats('decode-1')}")
        plain = pool.submit(_call, only_faulty, _body(2, False, LONG))
        status, lines = streamed.result()
        plain_status, plain_body = plain.result()
    assert status == 200 and lines[-1] == "data: [DONE]", lines[-3:]
    assert "error" in json.loads(lines[-2][6:]), lines[-3:]  # an error event, then [DONE]
    assert not _completed((status, lines), LONG)
    assert plain_status == 500 and "engine" in plain_body["error"]["message"], plain_body

    assert httpx.get(f"{cluster.urls['decode-0']}/health", timeout=5).status_code == 503
    registry = redis.Redis.from_url(cluster.redis.url)
    cluster.wait_until(lambda: json.loads(registry.get("kvf:node:decode-0"))["healthy"] is False, 30,
                       "decode-0 reports itself unhealthy in the node registry")
    cluster.wait_until_router_ejects("decode-0")  # the main router never called decode-0: it learns from probes

    def calls_taken(node: str) -> float:
        return sum(cluster.metric(node, m) for m in ("kvferry:prefix_cache_queries_tokens_total", "kvferry:local_prefills_total"))

    taken_before = calls_taken("decode-0")
    for seed in range(3, 9):  # round robin would send every second one to decode-0
        assert _completed(_call(cluster.router, _body(seed, seed % 2 == 0, SHORT)), SHORT)
    assert calls_taken("decode-0") == taken_before


def test_prefill_node_dying_before_its_transfer_falls_back_and_frees_the_reservation(tiny_models, tiny_llama_greedy):
    dying = {"prefill-0": ["-m", "support.faulty_node", "--die-before-transfer"]}
    cluster = DisaggregatedCluster(tiny_models["llama"], launchers=dying)
    try:
        body = _body(11, False, SHORT)
        started = time.monotonic()
        status, payload = _call(cluster.router, body)
        assert status == 200, payload
        expected = tiny_llama_greedy([body["prompt"]], SHORT)[0]
        assert payload["choices"][0]["token_ids"] == expected
        assert time.monotonic() - started < 30
        assert cluster.metric("decode-0", "kvferry:local_prefills_total") == 1
        assert dict(cluster.local.processes)["prefill-0"].wait(timeout=5) == 17  # it really died mid-request
        cluster.wait_until(lambda: cluster.stats("decode-0")["blocks"]["in_use"] == 0, 30, "reservation freed")
        assert cluster.stats("decode-0")["reserved"] == 0
    finally:
        cluster.stop()
