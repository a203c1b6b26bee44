"""Bad requests are refused at the router with an OpenAI-shaped error and never reach a node; the
context rule is one inequality, prompt tokens + max_tokens <= max_model_len, at every boundary.

The nodes run with --max-model-len 128, which the router learns from their registry records."""

from __future__ import annotations

import httpx
import pytest
from support.disaggregated_cluster import MODEL_NAME, DisaggregatedCluster

CONTEXT = 128


@pytest.fixture(scope="module")
def cluster(tiny_models):
    cluster = DisaggregatedCluster(tiny_models["llama"], role_flags={
        "prefill": ["--max-model-len", str(CONTEXT)], "decode": ["--max-model-len", str(CONTEXT)],
    })
    yield cluster
    cluster.stop()


def _node_calls(cluster: DisaggregatedCluster) -> float:
    """Everything that counts a request reaching a node: prompt lookups on both, local prefills on D."""
    return sum(
        cluster.metric(node, metric)
        for node in ("prefill-0", "decode-0")
        for metric in ("kvferry:prefix_cache_queries_tokens_total", "kvferry:local_prefills_total")
    )


def _post(cluster: DisaggregatedCluster, body: dict | bytes) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(f"{cluster.router}/v1/completions", content=body, headers={"content-type": "application/json"},
                          timeout=30)
    return httpx.post(f"{cluster.router}/v1/completions", json=body, timeout=30)


def _completion(**fields: object) -> dict:
    return {"model": MODEL_NAME, "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0, **fields}


BAD_REQUESTS = {
    "max_tokens zero": (_completion(max_tokens=0), 400),
    "max_tokens negative": (_completion(max_tokens=-3), 400),
    "prompt + max_tokens beyond the context": (_completion(prompt=[7] * 100, max_tokens=100), 400),
    "huge n": (_completion(n=100_000), 400),
    "negative token id": (_completion(prompt=[5, -1, 6]), 400),
    "token id outside the vocabulary": (_completion(prompt=[5, 10**9]), 400),
    "empty prompt text": (_completion(prompt=""), 400),
    "empty prompt ids": (_completion(prompt=[]), 400),
    "prompt of the wrong type": (_completion(prompt={"text": "hi"}), 400),
    "max_tokens of the wrong type": (_completion(max_tokens="ten"), 400),
    "temperature out of range": (_completion(temperature=-1), 400),
    "unknown model": (_completion(model="gpt-unknown"), 404),
    "body that is not JSON": (b"{not json", 400),
    "oversized body": (b'{"prompt": "' + b"x" * (4 << 20) + b'"}', 413),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_request_is_refused_before_any_node(cluster, case):
    body, status = BAD_REQUESTS[case]
    before = _node_calls(cluster)
    response = _post(cluster, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and error["type"] in {"invalid_request_error", "not_found_error"}, error
    assert _node_calls(cluster) == before


@pytest.mark.parametrize(
    ("prompt_tokens", "max_tokens", "accepted"),
    [
        (CONTEXT - 1, 1, True),  # the longest prompt: room for exactly one token
        (CONTEXT, 1, False),
        (CONTEXT + 1, 1, False),
        (100, CONTEXT - 100 - 1, True),  # prompt + max_tokens = context - 1
        (100, CONTEXT - 100, True),  # = context
        (100, CONTEXT - 100 + 1, False),  # = context + 1
    ],
)
def test_context_boundaries_follow_one_rule(cluster, prompt_tokens, max_tokens, accepted):
    body = _completion(prompt=[11] * prompt_tokens, max_tokens=max_tokens, ignore_eos=True)
    response = _post(cluster, body)
    if accepted:
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]
        # the prompts are all one token repeated, so an earlier case's KV may serve a prefix; the last token is computed
        cached = usage.pop("prompt_tokens_details")["cached_tokens"]
        assert 0 <= cached < prompt_tokens, cached
        assert usage == {
            "prompt_tokens": prompt_tokens, "completion_tokens": max_tokens, "total_tokens": prompt_tokens + max_tokens,
        }
    else:
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "context_length_exceeded"
