"""An abort storm: 100 concurrent streams through the router, 10 of them closed mid-stream. The other
90 get every token, the decode node records the 10 aborts, nothing stays held anywhere, and request ids
can be used again."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from support.disaggregated_cluster import MODEL_NAME, idle, reservation

STREAMS = 100
ABANDONED = 10
MAX_TOKENS = 16
ABANDONED_MAX_TOKENS = 1500  # still running when its client leaves
RETRIES = 5
TASK_SLACK = 3


def _stream(router: str, index: int, abandon: bool, started: threading.Barrier) -> tuple[int, str | None]:
    """Token count and finish reason of one stream; an abandoned one is closed after its first chunk."""
    prompt = [(index * 13 + i) % 1000 for i in range(20)]
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "max_tokens": ABANDONED_MAX_TOKENS if abandon else MAX_TOKENS,
        "stream_options": {"include_usage": True},
    }
    started.wait(timeout=60)
    tokens, finish = 0, None
    with httpx.Client(timeout=120) as client:
        for _ in range(RETRIES):  # as OpenAI's client does: a 429/503 with Retry-After is tried again
            with client.stream("POST", f"{router}/v1/completions", json=body) as response:
                if response.status_code in (429, 503):
                    time.sleep(float(response.headers["retry-after"]))
                    continue
                assert response.status_code == 200
                for line in response.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        tokens = chunk["usage"]["completion_tokens"]
                    for choice in chunk.get("choices", []):
                        finish = choice.get("finish_reason") or finish
                    if abandon:
                        return -1, None  # leaving the with-blocks closes the socket mid-stream
                break
    return tokens, finish


def test_abort_storm_loses_nothing_and_leaks_nothing(pd_cluster):
    processes = ("router", "prefill-0", "decode-0")
    tasks_before = {name: pd_cluster.metric(name, "kvferry:asyncio_tasks") for name in processes}
    abandoned = set(range(0, STREAMS, STREAMS // ABANDONED))
    barrier = threading.Barrier(STREAMS)
    with ThreadPoolExecutor(STREAMS) as pool:
        results = list(
            pool.map(lambda i: _stream(pd_cluster.router, i, i in abandoned, barrier), range(STREAMS))
        )
    kept = [result for index, result in enumerate(results) if index not in abandoned]
    assert kept == [(MAX_TOKENS, "length")] * (STREAMS - ABANDONED), f"logs in {pd_cluster.local.workdir}"
    left = [results[index] for index in sorted(abandoned)]
    assert left == [(-1, None)] * ABANDONED, f"every abandoned stream started before its client left: {left}"

    for node in ("decode-0", "prefill-0"):
        pd_cluster.wait_until(
            lambda n=node: idle(pd_cluster.stats(n)), 30, lambda n=node: f"{n} idle: {pd_cluster.stats(n)}"
        )
    # Every abandoned stream is stopped when its client leaves (not left to run its 1500 tokens), and
    # counted once: the router and the nodes close their streams at once, not at garbage collection.
    assert pd_cluster.metric("decode-0", "kvferry:aborted_requests_total") == ABANDONED

    # No task outlives its stream (a leaked one per request would add ten or a hundred, for good); the slack
    # and the wait are for the processes' own periodic work (probes, reports, late aborts) caught in flight.
    def tasks_settled() -> bool:
        return all(pd_cluster.metric(n, "kvferry:asyncio_tasks") <= tasks_before[n] + TASK_SLACK for n in processes)

    pd_cluster.wait_until(tasks_settled, 15, lambda: f"tasks back to {tasks_before}: "
                          f"{ {n: pd_cluster.metric(n, 'kvferry:asyncio_tasks') for n in processes} }")

    # Request ids are free again once aborted: the same id reserves, aborts and reserves anew.
    decode = pd_cluster.urls["decode-0"]
    body = {"request_id": "storm-again", "prompt_token_ids": [1, 2, 3], "sampling": {"max_tokens": 2}}
    for _ in range(2):
        with reservation(decode, body) as reserved:
            assert reserved["handle"]["request_id"] == "storm-again"
            assert httpx.post(f"{decode}/internal/v1/abort/storm-again", timeout=10).status_code == 200
    assert idle(pd_cluster.stats("decode-0"))
