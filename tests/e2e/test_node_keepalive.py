"""A router whose event loop lags still never reuses a connection its decode node has closed.

The router's stream client (aiohttp) takes an idle connection back for up to its keep-alive without asking
the socket whether the node closed it meanwhile; it only knows of a close once its loop has read the FIN.
So a node must keep idle connections open well past the router's keep-alive plus any lag of the router's
loop: when the node closed them after 5 s (uvicorn's default) against the router's 4, one second of lag on
a loaded router (pods starting beside it) made a request fail with "Can not write request body" on a
connection the node had closed while the router's loop was busy. Here a real decode node and the router's
own client, with the lag made on purpose: the loop blocked as the first stream ends (its connection goes
back to the pool late) and again as the node's old deadline passes (the FIN, if any, stays unread).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from support.disaggregated_cluster import DisaggregatedCluster

from kvferry.internal_api import API_PREFIX, CALLER_KEEPALIVE_SECONDS
from kvferry.router.dispatch.node_streams import NodeStreams

UVICORN_DEFAULT_KEEPALIVE = 5.0  # what the nodes had
# The second call: within the router's keep-alive by enough that a loaded machine's scheduling delays still
# leave it reusing the connection.
REUSE_SECONDS = CALLER_KEEPALIVE_SECONDS - 0.5
# The router's loop busy while the first stream's last chunk waits, so that the second call comes 0.3 s past
# the node's old deadline.
LAG_SECONDS = max(0.0, UVICORN_DEFAULT_KEEPALIVE + 0.3 - REUSE_SECONDS)


@pytest.fixture
def decode_url(tiny_models):
    cluster = DisaggregatedCluster(tiny_models["llama"], num_prefill=0, use_redis=False)
    yield cluster.urls["decode-0"]
    cluster.stop()


async def _generate(streams: NodeStreams, url: str, request_id: str, lag: float = 0.0) -> tuple[object, list[bytes]]:
    """The call's connection (its protocol object) and the stream's lines."""
    body = {"request_id": request_id, "prompt_token_ids": [1, 2, 3], "sampling": {"max_tokens": 2}}
    async with streams.post(f"{url}{API_PREFIX}/generate", body, {}) as response:
        assert response.status == 200, await response.read()
        connection = response.connection.protocol
        time.sleep(lag)  # blocks the loop: the stream's end is read, and its connection pooled, this late
        return connection, (await response.read()).splitlines()


def test_a_connection_reused_late_in_the_routers_keepalive_is_still_open(decode_url) -> None:
    async def scenario() -> tuple[object, object, list[bytes]]:
        streams = NodeStreams({})
        try:
            first, _ = await _generate(streams, decode_url, "first", lag=LAG_SECONDS)
            reuse_at = time.monotonic() + REUSE_SECONDS  # the node finished its response LAG_SECONDS before now
            await asyncio.sleep(REUSE_SECONDS - 0.8)
            time.sleep(reuse_at - time.monotonic())  # blocked across the old deadline: a FIN would lie unread
            second, lines = await _generate(streams, decode_url, "second")
            return first, second, lines
        finally:
            await streams.aclose()

    first, second, lines = asyncio.run(scenario())
    assert second is first  # the pooled connection served the second call
    assert lines and b'"finish_reason":"length"' in lines[-1].replace(b" ", b""), lines
