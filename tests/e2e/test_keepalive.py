"""A client whose event loop lags never reuses a connection that a kvferry server has closed.

aiohttp (the router's stream client, kvferry loadgen, vLLM's serving benchmark) takes an idle connection back
for up to its keep-alive without asking the socket whether the server closed it meanwhile; it knows of a
close only once its loop has read the FIN. So a server must keep idle connections open well past its clients'
keep-alive plus any lag of their loops: when the nodes closed them after 5 s (uvicorn's default) against the
router's 4, one second of lag on a loaded router (pods starting beside it) failed a request with "Can not
write request body" on a connection the node had closed while the router's loop was busy.

Here a real decode node and router, each called by an aiohttp client with the keep-alive its real callers
have, and the lag made on purpose: the client's loop blocked as the first response ends (its connection goes
back to the pool late) and again as uvicorn's default deadline passes (the FIN, if any, stays unread); the
second call reuses the connection.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from support.disaggregated_cluster import MODEL_NAME, DisaggregatedCluster

from kvferry.internal_api import API_PREFIX, CALLER_KEEPALIVE_SECONDS

UVICORN_DEFAULT_KEEPALIVE = 5.0  # what the nodes and the router had
AIOHTTP_DEFAULT_KEEPALIVE = 15.0  # kvferry loadgen's session (kvferry/loadgen/client.py), vLLM's benchmark's
PAST_THE_DEADLINE = 0.3  # the second call comes this long after the server's old deadline
BLOCKED_ACROSS = 0.8  # the client's loop is blocked this long before the second call
# Within the client's keep-alive by enough that a loaded machine's scheduling delays still leave it reusing.
REUSE_MARGIN = 0.5
STREAM_TOKENS = 32


@pytest.fixture(scope="module")
def cluster(tiny_models):
    cluster = DisaggregatedCluster(tiny_models["llama"], num_prefill=0, use_redis=False)
    yield cluster
    cluster.stop()


def _counting_connections(counts: Counter) -> aiohttp.TraceConfig:
    trace = aiohttp.TraceConfig()

    async def created(*_: Any) -> None:
        counts["created"] += 1

    async def reused(*_: Any) -> None:
        counts["reused"] += 1

    trace.on_connection_create_end.append(created)
    trace.on_connection_reuseconn.append(reused)
    return trace


async def _reused_late(url: str, body: Callable[[str], dict[str, Any]], keepalive: float, reuse_seconds: float) -> bytes:
    """Two calls from a client that keeps idle connections `keepalive` seconds, the second `reuse_seconds`
    after the first's connection went back to the pool and just past uvicorn's default deadline, with the
    loop blocked across it; the second call's response. `body`: a call's, given its request id."""
    lag = max(0.0, UVICORN_DEFAULT_KEEPALIVE + PAST_THE_DEADLINE - reuse_seconds)
    counts: Counter = Counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(keepalive_timeout=keepalive),
                                     trace_configs=[_counting_connections(counts)]) as session:
        async with session.post(url, json=body("first")) as response:
            time.sleep(lag)  # blocks the loop: the response's end is read, and its connection pooled, this late
            assert response.status == 200, await response.read()
            await response.read()
        reuse_at = time.monotonic() + reuse_seconds  # the server finished its response `lag` before now
        await asyncio.sleep(reuse_seconds - BLOCKED_ACROSS)
        time.sleep(max(0.0, reuse_at - time.monotonic()))  # blocked across the old deadline: a FIN would lie unread
        async with session.post(url, json=body("second")) as response:
            assert response.status == 200, await response.read()
            answer = await response.read()
    assert counts == {"created": 1, "reused": 1}  # the pooled connection served the second call
    return answer


def test_a_node_connection_the_router_reuses_late_is_still_open(cluster) -> None:
    """As the router's stream client calls a node (router/dispatch/node_streams.py)."""
    def body(request_id: str) -> dict[str, Any]:  # a stream long enough that its end comes after the lag began
        return {"request_id": request_id, "prompt_token_ids": [1, 2, 3],
                "sampling": {"max_tokens": STREAM_TOKENS, "ignore_eos": True}}

    answer = asyncio.run(_reused_late(f"{cluster.urls['decode-0']}{API_PREFIX}/generate", body,
                                      CALLER_KEEPALIVE_SECONDS, CALLER_KEEPALIVE_SECONDS - REUSE_MARGIN))
    last = answer.splitlines()[-1]
    assert b'"finish_reason":"length"' in last.replace(b" ", b""), last


def test_a_router_connection_a_client_reuses_past_uvicorns_default_is_still_open(cluster) -> None:
    def body(_: str) -> dict[str, Any]:  # the router makes its own request ids
        return {"model": MODEL_NAME, "prompt": [1, 2, 3], "max_tokens": 2, "ignore_eos": True}

    answer = asyncio.run(_reused_late(f"{cluster.router}/v1/completions", body, AIOHTTP_DEFAULT_KEEPALIVE,
                                      UVICORN_DEFAULT_KEEPALIVE + PAST_THE_DEADLINE))
    assert b'"completion_tokens":2' in answer.replace(b" ", b""), answer
