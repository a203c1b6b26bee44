"""One id per request through router, prefill and decode (kvferry/request_id.py), JSON log lines
(kvferry/logs.py) and the router's generated-token counter, on a real disaggregated cluster (random tiny
weights: this is about ids, lines and counts, not text)."""

from __future__ import annotations

import json

import httpx
import pytest
from support.disaggregated_cluster import MODEL_NAME, DisaggregatedCluster

MAX_TOKENS = 5
CLIENT_ID = "client-abc-123"


@pytest.fixture(scope="module")
def json_logged_cluster(tiny_models):
    with pytest.MonkeyPatch.context() as env:  # the processes inherit it; one cluster for the module's tests
        env.setenv("KVFERRY_LOG_FORMAT", "json")
        env.setenv("KVFERRY_LOG_LEVEL", "info")
        cluster = DisaggregatedCluster(tiny_models["llama"])
    yield cluster
    cluster.stop()


def _json_lines(text: str) -> list[dict]:
    """The process's log lines; UCX writes its own warnings from C, plain, beside them."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _complete(router: str, headers: dict[str, str], stream: bool) -> httpx.Response:
    body = {"model": MODEL_NAME, "prompt": list(range(100, 140)), "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": stream}
    response = httpx.post(f"{router}/v1/completions", json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response


def test_the_clients_request_id_reaches_every_process_and_its_log_lines(json_logged_cluster) -> None:
    cluster = json_logged_cluster
    generated_before = cluster.metric("router", "kvferry:generation_tokens_total")

    answer = _complete(cluster.router, {"X-Request-Id": CLIENT_ID}, stream=False)
    assert answer.headers["x-request-id"] == CLIENT_ID
    made = _complete(cluster.router, {}, stream=True).headers["x-request-id"]  # none sent: the router makes one
    assert len(made) == 32 and int(made, 16) >= 0

    refused = httpx.post(f"{cluster.router}/v1/completions", headers={"X-Request-Id": "two words"},
                         json={"model": MODEL_NAME, "prompt": "x", "max_tokens": 1}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_request_id"

    assert cluster.metric("router", "kvferry:generation_tokens_total") - generated_before == 2 * MAX_TOKENS

    def lines(name: str, request_id: str) -> list[dict]:
        return [line for line in _json_lines(cluster.log(name)) if line.get("request_id") == request_id]

    cluster.wait_until(lambda: lines("router", made), 10, "the streamed request's line")
    [finished] = [line for line in lines("router", CLIENT_ID) if line["logger"] == "kvferry.router.requests"]
    usage = answer.json()["usage"]
    assert (finished["status"], finished["stream"]) == (200, False)
    assert (finished["prompt_tokens"], finished["completion_tokens"]) == (usage["prompt_tokens"], MAX_TOKENS)
    assert 0 < finished["ttft_s"] <= finished["e2e_s"]
    # The line carries the request's TTFT phases (router time included), which add up to its TTFT as in the
    # histograms below; the KV crossed, so the prefill node reported its own.
    phases = finished["ttft_phases_s"]
    assert set(phases) == {"router", "prefill_queue", "prefill_compute", "transfer", "first_step", "other"}
    assert phases["prefill_compute"] > 0 and phases["router"] > 0
    assert sum(phases.values()) == pytest.approx(finished["ttft_s"], rel=0.02, abs=1e-3)
    [streamed] = [line for line in lines("router", made) if line["logger"] == "kvferry.router.requests"]
    assert (streamed["status"], streamed["stream"], streamed["completion_tokens"]) == (200, True, MAX_TOKENS)
    # Both nodes wrote their line for it, under the client's id.
    [sent] = [line for line in lines("prefill-0", CLIENT_ID) if line["message"] == "prefill sent"]
    assert sent["prompt_tokens"] == usage["prompt_tokens"] and sent["to"] == "decode-0" and sent["kv_bytes"] > 0
    [reserved] = [line for line in lines("decode-0", CLIENT_ID) if line["message"] == "decode reserved"]
    assert reserved["node_request_id"] == sent["node_request_id"]
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in _json_lines(cluster.log("router")))


def test_the_routers_ttft_phases_add_up_to_each_ttft_and_agree_with_the_nodes(json_logged_cluster) -> None:
    cluster = json_logged_cluster
    phases = ("router", "prefill_queue", "prefill_compute", "transfer", "first_step", "other")

    def reading() -> dict[str, float]:
        """The router's phase sums and counts, its TTFT sum, and the nodes' own phase sums, now."""
        values = {f"{name} {part}": cluster.metric("router", f'kvferry:router_ttft_phase_seconds_{part}{{phase="{name}"}}')
                  for name in phases for part in ("sum", "count")}
        values["ttft"] = cluster.metric("router", "kvferry:time_to_first_token_seconds_sum")
        values["prefill node"] = cluster.metric("prefill-0", "kvferry:ttft_phase_seconds_sum")
        values["decode node"] = cluster.metric("decode-0", "kvferry:ttft_phase_seconds_sum")
        return values

    before = reading()
    for stream in (False, True, False):
        _complete(cluster.router, {}, stream=stream)
    after = reading()
    added = {key: after[key] - before[key] for key in after}

    assert all(added[f"{name} count"] == 3 for name in phases)
    # Each request's phases add up to its TTFT, so the sums do too (within what two processes' clock readings
    # can overlap: the prefill node hears that its last write landed a moment after the decode node began).
    assert sum(added[f"{name} sum"] for name in phases) == pytest.approx(added["ttft"], rel=0.02)
    assert all(added[f"{name} sum"] > 0 for name in ("router", "prefill_compute", "transfer", "first_step"))
    # The prefill node's part is what it measured itself (its own histograms: queue, prefill, transfer).
    prefill_part = sum(added[f"{name} sum"] for name in ("prefill_queue", "prefill_compute", "transfer"))
    assert prefill_part == pytest.approx(added["prefill node"], abs=1e-3)
    # The decode node's first step too, as its first_decode histogram has it (a clock read apart).
    assert added["first_step sum"] == pytest.approx(added["decode node"], abs=3e-3)
