"""Faults on the disaggregated path with real processes (redis-server, nodes over UCX, router):
a client that leaves, a prefill or decode node killed, Redis stopped and restarted; and the second turn
of a chat moving only the blocks the decode node lacks."""

from __future__ import annotations

import math
import random

import httpx
import redis
from support.disaggregated_cluster import (
    LEASE_SECONDS,
    MODEL_NAME,
    DisaggregatedCluster,
    idle,
    reservation,
)

BLOCK_SIZE = 16


def _body(prompt: list[int], max_tokens: int, stream: bool = False) -> dict:
    return {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream}


def _complete(cluster: DisaggregatedCluster, prompt: list[int], max_tokens: int) -> dict:
    response = httpx.post(f"{cluster.router}/v1/completions", json=_body(prompt, max_tokens), timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def _stream(cluster: DisaggregatedCluster, prompt: list[int], max_tokens: int):
    return httpx.stream("POST", f"{cluster.router}/v1/completions", json=_body(prompt, max_tokens, stream=True), timeout=30)


def _prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000) for _ in range(length)]


def test_client_that_disconnects_is_aborted_on_both_nodes(pd_cluster):
    with _stream(pd_cluster, _prompt(1, 40), max_tokens=1500) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line).startswith("data: ")
        pd_cluster.wait_until(
            lambda: pd_cluster.stats("decode-0")["running"] == 1, 30, "the decode node runs the request"
        )
    # Leaving the block closed the connection mid-stream.
    pd_cluster.wait_until(lambda: idle(pd_cluster.stats("decode-0")), 30, "decode node idle, its blocks freed")
    assert idle(pd_cluster.stats("prefill-0"))
    assert pd_cluster.metric("decode-0", "kvferry:aborted_requests_total") == 1
    assert pd_cluster.metric("decode-0", "kvferry:num_requests_running") == 0


def test_prefill_node_killed_falls_back_to_local_prefill_with_the_same_tokens(pd_cluster, tiny_llama_greedy):
    prompt = _prompt(2, 70)
    expected = tiny_llama_greedy([prompt], 8)[0]
    assert _complete(pd_cluster, prompt, 8)["token_ids"] == expected
    assert pd_cluster.metric("decode-0", "kvferry:local_prefills_total") == 0
    pd_cluster.kill("prefill-0")
    other = _prompt(3, 50)
    assert _complete(pd_cluster, other, 8)["token_ids"] == tiny_llama_greedy([other], 8)[0]
    assert pd_cluster.metric("decode-0", "kvferry:local_prefills_total") == 1
    assert idle(pd_cluster.stats("decode-0"))


def test_redis_stopped_mid_run_requests_still_succeed_and_the_index_recovers(pd_cluster, tiny_llama_greedy):
    index = redis.Redis.from_url(pd_cluster.redis.url)
    node_blocks = f"kvf:{MODEL_NAME}:node-blocks:prefill-0"
    first = _prompt(5, 64)
    _complete(pd_cluster, first, 4)
    pd_cluster.wait_until(
        lambda: index.scard(node_blocks) >= len(first) // BLOCK_SIZE, 30, "prefill-0's blocks indexed"
    )
    pd_cluster.redis.stop()
    local_before = pd_cluster.metric("decode-0", "kvferry:local_prefills_total")
    during = _prompt(6, 48)
    assert _complete(pd_cluster, during, 6)["token_ids"] == tiny_llama_greedy([during], 6)[0]
    # The prefill node knew the decode node before the outage: its KV still travelled, no local prefill.
    assert pd_cluster.metric("decode-0", "kvferry:local_prefills_total") == local_before
    pd_cluster.restart_redis()  # same port, empty: everything the nodes knew must come back
    index = redis.Redis.from_url(pd_cluster.redis.url)
    pd_cluster.wait_until(
        lambda: index.exists("kvf:node:prefill-0") and index.exists("kvf:node:decode-0"),
        30,
        "both nodes back in the node registry",
    )
    expected_blocks = (len(first) + len(during)) // BLOCK_SIZE
    pd_cluster.wait_until(
        lambda: index.scard(node_blocks) >= expected_blocks, 30, "the prefix index resynchronised"
    )
    assert pd_cluster.stats("prefill-0")["reporter"]["index_failures"] >= 1
    after = _prompt(7, 33)
    assert _complete(pd_cluster, after, 6)["token_ids"] == tiny_llama_greedy([after], 6)[0]


def test_second_turn_of_a_chat_sends_only_the_blocks_the_decode_node_lacks(pd_cluster):
    first = _prompt(8, 100)
    sent_before = pd_cluster.stats("prefill-0")["transfer"]["bytes_sent"]
    reply = _complete(pd_cluster, first, 20)["token_ids"]
    first_bytes = pd_cluster.stats("prefill-0")["transfer"]["bytes_sent"] - sent_before
    block_bytes = first_bytes / math.ceil(len(first) / BLOCK_SIZE)  # the decode node held nothing yet
    assert block_bytes == int(block_bytes) and block_bytes > 0
    hits_before = pd_cluster.metric("decode-0", "kvferry:prefix_cache_hits_tokens_total")

    second = first + reply + _prompt(9, 30)  # the next turn: the history, then the new message
    _complete(pd_cluster, second, 4)
    second_bytes = pd_cluster.stats("prefill-0")["transfer"]["bytes_sent"] - sent_before - first_bytes
    held_blocks = (
        pd_cluster.metric("decode-0", "kvferry:prefix_cache_hits_tokens_total") - hits_before
    ) / BLOCK_SIZE
    assert held_blocks >= len(first) // BLOCK_SIZE  # at least the first prompt's full blocks stayed on D
    assert second_bytes == (math.ceil(len(second) / BLOCK_SIZE) - held_blocks) * block_bytes
    assert second_bytes < first_bytes


def test_kv_whose_decode_stream_was_left_is_freed_and_refused(pd_cluster):
    """The router gone in the gap between P and D (it read the reservation, then left): the decode node frees
    the reserved blocks as soon as its stream closes, the prefill node's writes into them are refused (it
    answers with an error, holding nothing), and both nodes end idle."""
    decode, prefill = pd_cluster.urls["decode-0"], pd_cluster.urls["prefill-0"]
    body = {
        "request_id": "gap-1",
        "prompt_token_ids": _prompt(10, 45),
        "sampling": {"max_tokens": 4, "temperature": 0},
    }
    with reservation(decode, body) as reserved:
        handle = reserved["handle"]
        assert pd_cluster.stats("decode-0")["reserved"] == 1
    pd_cluster.wait_until(lambda: idle(pd_cluster.stats("decode-0")), LEASE_SECONDS, lambda: pd_cluster.stats("decode-0"))
    late = httpx.post(f"{prefill}/internal/v1/prefill", json={**body, "handle": handle}, timeout=10)
    assert late.status_code == 502, late.text  # the lease is gone: its writes are refused
    assert idle(pd_cluster.stats("prefill-0")) and idle(pd_cluster.stats("decode-0"))


def test_stale_index_entries_of_a_dead_prefill_node_are_never_routed_to(tiny_models):
    cluster = DisaggregatedCluster(tiny_models["llama"], num_prefill=2)
    try:
        index = redis.Redis.from_url(cluster.redis.url)
        shared = _prompt(12, 96)
        _complete(cluster, shared, 2)
        holder = cluster.wait_until(
            lambda: next(
                (
                    p
                    for p in ("prefill-0", "prefill-1")
                    if index.scard(f"kvf:{MODEL_NAME}:node-blocks:{p}") >= 6
                ),
                None,
            ),
            5,
            "the prompt's blocks indexed on the prefill node that computed them",
        )
        survivor = "prefill-1" if holder == "prefill-0" else "prefill-0"
        cluster.kill(holder)
        assert index.scard(f"kvf:{MODEL_NAME}:node-blocks:{holder}") >= 6  # its entries stay behind, stale
        cluster.wait_until_router_ejects(holder)  # the router's probe finds the node dead
        hits = cluster.metric(survivor, "kvferry:prefix_cache_queries_tokens_total")
        for seed in range(13, 16):  # the same long prefix, which only the dead node's entries point at
            _complete(cluster, shared + _prompt(seed, 8), 2)
        assert cluster.metric(survivor, "kvferry:prefix_cache_queries_tokens_total") > hits
        assert (
            cluster.metric("decode-0", "kvferry:local_prefills_total") == 0
        )  # no call went to the dead node
    finally:
        cluster.stop()
