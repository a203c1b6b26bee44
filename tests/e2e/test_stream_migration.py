"""Mid-stream migration with real processes (router/dispatch/migration.py): a decode node SIGKILLed under 16
concurrent streams, and every stream goes on on the other decode node with exactly the undisturbed text; the
only decode node killed, and its streams end with a clean error at once."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import pytest
from support.disaggregated_cluster import MODEL_NAME, DisaggregatedCluster
from support.fake_node import StallingPrefillNode

STREAMS = 16
SEEDED = 4  # of them, sampled with a seed: they continue from the same sampler state
MAX_TOKENS = 400
CLEAN_ERROR_SECONDS = 5.0
MID_STREAM = 4  # streams decode-0 decodes when it is killed
DRAIN_GRACE_SECONDS = 0.5
# The decode nodes' least time a step (support.faulty_node --min-step-seconds): a stream of MAX_TOKENS then
# decodes for at least 4 s on any machine. Unpaced, the float32 C kernels decode 8 of the tiny model's
# streams of 400 tokens in about 0.4 s, while the 16 streams reached the router over 0.6-3.8 s (two cores,
# two more processes busy): decode-0 then ran its streams a few at a time, or the 0.1 s poll of its /stats
# (one call took up to 1.3 s) saw it between them, never 4 at once, as in a clean-clone CI run's failure.
STEP_SECONDS = 0.01


def _body(index: int, stream: bool) -> dict:
    rng = random.Random(index)
    sampling = {"temperature": 0.8, "seed": 1000 + index} if index < SEEDED else {"temperature": 0}
    return {"model": MODEL_NAME, "prompt": [rng.randrange(1000) for _ in range(30 + index)], "max_tokens": MAX_TOKENS,
            "ignore_eos": True, "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {}),
            **sampling}


@dataclass
class StreamRecord:
    text: str = ""
    completion_tokens: int | None = None
    errors: list[dict] = field(default_factory=list)
    events: int = 0


def _read_stream(router: str, index: int, record: StreamRecord) -> StreamRecord:
    with httpx.stream("POST", f"{router}/v1/completions", json=_body(index, stream=True), timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line.removeprefix("data: "))
            if "error" in event:
                record.errors.append(event["error"])
            elif event.get("usage"):
                record.completion_tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices", []):
                record.text += choice["text"]
                record.events += 1
    return record


def _undisturbed(router: str) -> list[str]:
    def one(index: int) -> str:
        response = httpx.post(f"{router}/v1/completions", json=_body(index, stream=False), timeout=120)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]

    with ThreadPoolExecutor(STREAMS) as pool:
        return list(pool.map(one, range(STREAMS)))


def _paced(*decode_nodes: str) -> dict[str, list[str]]:
    return {name: ["-m", "support.faulty_node", "--min-step-seconds", str(STEP_SECONDS)] for name in decode_nodes}


@pytest.fixture
def two_by_two(tiny_models):
    # A drained decode node cuts its streams after 0.5 s: 4 paced streams of 400 tokens cannot end in that
    # time; with the default 3 s, a quiet machine decoded all of them before the cut (no migration). Both
    # decode nodes are paced alike, so that neither holds its streams longer in the router's queue counts.
    cluster = DisaggregatedCluster(tiny_models["llama"], num_prefill=2, num_decode=2,
                                   launchers=_paced("decode-0", "decode-1"),
                                   role_flags={"decode": ["--shutdown-grace", str(DRAIN_GRACE_SECONDS)]})
    yield cluster
    cluster.stop()


def _every_stream_survives(cluster: DisaggregatedCluster, disrupt: Callable[[], None]) -> int:
    """16 streams through the router; once decode-0 decodes MID_STREAM of them (others may still be prefilling
    or travelling into it), `disrupt` takes it away. Every stream must complete with its undisturbed text and
    all its tokens, no error event. Returns how many decode-0 was decoding."""
    expected = _undisturbed(cluster.router)
    records = [StreamRecord() for _ in range(STREAMS)]
    with ThreadPoolExecutor(STREAMS) as pool:
        futures = [pool.submit(_read_stream, cluster.router, i, records[i]) for i in range(STREAMS)]

        def decode_0_running() -> int:
            running = cluster.stats("decode-0")["running"]
            return running if running >= MID_STREAM else 0

        running = cluster.wait_until(
            decode_0_running, 60,
            lambda: f"decode-0 decoding {MID_STREAM} streams: {cluster.stats('decode-0')['running']} running, "
                    f"{sum(1 for r in records if r.events)} of {STREAMS} streams with tokens, "
                    f"{sum(1 for r in records if r.completion_tokens)} complete; decode-1 running "
                    f"{cluster.stats('decode-1')['running']}",  # where the burst went, when it fails
        )
        disrupt()
        done = [f.result(timeout=120) for f in futures]
    for index, (record, text) in enumerate(zip(done, expected, strict=True)):
        assert record.errors == [], f"stream {index}: {record.errors}"
        assert record.completion_tokens == MAX_TOKENS, f"stream {index}"
        assert record.text == text, f"stream {index} differs from its undisturbed run"
    return running


def test_decode_node_killed_under_16_streams_every_stream_completes_with_the_undisturbed_text(two_by_two):
    running = _every_stream_survives(two_by_two, lambda: two_by_two.kill("decode-0"))
    # Those it was decoding, and any whose KV it was waiting for.
    assert two_by_two.metric("router", 'kvferry:router_migrations_total{outcome="migrated"}') >= running


def test_a_drained_decode_node_hands_its_streams_over_and_every_stream_completes(two_by_two):
    """SIGTERM (a pod deleted, a node drained): the decode node stops taking requests and cuts its streams
    when its graceful-shutdown period (DRAIN_GRACE_SECONDS) is over; the router migrates each like a lost one."""

    def drain() -> None:
        two_by_two.send_signal("decode-0", signal.SIGTERM)
        # Its streams are cut at the end of the grace period, so the node is gone soon, whatever they had left.
        two_by_two.wait_until(lambda: two_by_two.exited("decode-0"), 15, "decode-0 gone after its drain")

    _every_stream_survives(two_by_two, drain)
    assert two_by_two.metric("router", 'kvferry:router_migrations_total{outcome="migrated"}') >= 1


def test_the_only_decode_node_killed_ends_its_stream_with_a_clean_error_at_once(tiny_models):
    # Paced, so that the stream still decodes when it is killed (unpaced, its 400 tokens took 0.3-0.9 s).
    cluster = DisaggregatedCluster(tiny_models["llama"], launchers=_paced("decode-0"))
    try:
        record = StreamRecord()
        reader = threading.Thread(target=_read_stream, args=(cluster.router, STREAMS, record))  # greedy, unseeded
        reader.start()
        cluster.wait_until(lambda: record.events >= 2, 60, "the stream's first tokens")
        cluster.kill("decode-0")
        killed = time.monotonic()
        reader.join(timeout=30)
        assert not reader.is_alive() and time.monotonic() - killed < CLEAN_ERROR_SECONDS
        assert len(record.errors) == 1 and "no other decode node" in record.errors[0]["message"], record.errors
        assert record.completion_tokens is None  # never reported as complete
        # A new request fails as fast and as clearly, whether or not the router's probes have noticed yet.
        started = time.monotonic()
        response = httpx.post(f"{cluster.router}/v1/completions", json=_body(STREAMS, stream=False), timeout=30)
        assert response.status_code == 503 and time.monotonic() - started < CLEAN_ERROR_SECONDS, response.text
        assert cluster.metric("router", 'kvferry:router_migrations_total{outcome="no_node"}') >= 1

        # Both failures are in the router's log at its default level (warning), each with what its client was told.
        def failed_lines() -> dict[str, str]:
            return {"stream" if " stream=True" in line else "plain": line for line in cluster.log("router").splitlines()
                    if " WARNING kvferry.router.requests" in line and " status=503 " in line}

        def both_logged() -> dict[str, str] | None:
            lines = failed_lines()
            return lines if lines.keys() == {"stream", "plain"} else None

        lines = cluster.wait_until(both_logged, 10, lambda: f"both failed requests in the router's log: {failed_lines()}")
        assert "error=decode node decode-0 failed" in lines["stream"] and "no other decode node" in lines["stream"]
        assert f"error={response.json()['error']['message']}" in lines["plain"]
    finally:
        cluster.stop()


def test_a_decode_node_lost_while_the_prefill_node_works_ends_the_prefill_call_at_once(tiny_models):
    """The router reads the decode stream while the prefill call is out: the decode node's death is seen at
    once, the prefill node is told to abort (freeing the KV it held) and the client gets its clean error,
    rather than all of that after the prefill call returns (here it would hang for 30 s)."""
    stalling = StallingPrefillNode(stall_seconds=30)
    cluster = DisaggregatedCluster(tiny_models["llama"], num_prefill=0)
    try:
        cluster.urls["prefill-stalling"] = stalling.url
        # The fake publishes no registry record, so this router reads none (an empty folder): a router that
        # knows no node's KV identity pairs any prefill node with any decode node.
        router = cluster.add_router("router-stalled", ["prefill-stalling", "decode-0"],
                                    ["--registry", f"file://{cluster.local.workdir / 'no-records'}"])
        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(httpx.post, f"{router}/v1/completions", json=_body(STREAMS, stream=False), timeout=60)
            cluster.wait_until(lambda: stalling.prefill_ids(), 30, "the prefill call out to the stalling node")
            cluster.kill("decode-0")
            killed = time.monotonic()
            response = call.result(timeout=30)
        assert time.monotonic() - killed < CLEAN_ERROR_SECONDS
        assert response.status_code == 503 and "no other decode node" in response.text, response.text
        cluster.wait_until(lambda: stalling.aborted(stalling.prefill_ids()[0]), CLEAN_ERROR_SECONDS,
                           "the prefill node told to abort")
    finally:
        cluster.stop()
        stalling.stop()
