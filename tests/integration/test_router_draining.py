"""A router pod's preStop hook (router/api/draining.py) on a real uvicorn server: before `GET /drain` a
client's requests share one keep-alive connection; from the hook's call on, each response says
`Connection: close` and the server closes it, so the client's next request comes on a new connection
(which, on Kubernetes, kube-proxy sends to another router). A response begun before the call keeps the hook
waiting until its client has sent its next request."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse

from kvferry.cli.ports import free_port
from kvferry.router.api.draining import REUSE_MARGIN_S, DrainingMiddleware

SLOW_S = 1.5  # how long /slow takes to answer


async def echo_client_port(scope, receive, send) -> None:
    """The app behind the middleware: which client port (connection) each request came on; /slow answers
    after SLOW_S, as a long stream would end."""
    if scope["path"] == "/slow":
        await asyncio.sleep(SLOW_S)
    await JSONResponse({"port": Request(scope).client.port})(scope, receive, send)


@pytest.fixture
def server() -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(DrainingMiddleware(echo_client_port), host="127.0.0.1", port=port, log_level="warning")
    served = uvicorn.Server(config)
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not served.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    served.should_exit = True
    thread.join(timeout=10)


def test_after_the_drain_call_every_response_closes_its_connection(server: str) -> None:
    with httpx.Client(base_url=server, timeout=10) as client:
        before = [client.get("/v1/models") for _ in range(3)]
        assert all("close" not in r.headers.get("connection", "") for r in before)
        assert len({r.json()["port"] for r in before}) == 1  # one keep-alive connection

        started = time.monotonic()
        drained = client.get("/drain", params={"seconds": "0.3"})
        assert drained.status_code == 200 and drained.json() == {"status": "draining"}
        assert time.monotonic() - started >= 0.3  # the hook waits as long as it was told

        after = [client.get("/v1/models") for _ in range(3)]
        assert all(r.status_code == 200 and r.headers["connection"] == "close" for r in after)
        assert len({r.json()["port"] for r in after}) == 3  # each on a connection of its own


def test_a_bad_wait_drains_at_once(server: str) -> None:
    started = time.monotonic()
    assert httpx.get(f"{server}/drain", params={"seconds": "soon"}, timeout=10).status_code == 200
    assert time.monotonic() - started < 5
    assert httpx.get(f"{server}/x", timeout=10).headers["connection"] == "close"


def test_a_response_begun_before_the_drain_keeps_the_hook_until_its_client_came_back(server: str) -> None:
    """The slow response's headers go out after the call, so they say close too; the hook still waits for it,
    then for REUSE_MARGIN_S, and only within `longest`."""
    with httpx.Client(base_url=server, timeout=10) as client, ThreadPoolExecutor(1) as pool:
        slow = pool.submit(client.get, "/slow")
        time.sleep(0.3)  # the slow request is in flight
        started = time.monotonic()
        assert httpx.get(f"{server}/drain", params={"seconds": "0.1", "longest": "30"}, timeout=10).status_code == 200
        waited = time.monotonic() - started
        assert slow.result().status_code == 200
        assert SLOW_S - 0.3 + REUSE_MARGIN_S - 0.1 <= waited < SLOW_S + REUSE_MARGIN_S + 2

        slow = pool.submit(client.get, "/slow")
        time.sleep(0.3)
        started = time.monotonic()
        assert httpx.get(f"{server}/drain", params={"seconds": "0", "longest": "0.2"}, timeout=10).status_code == 200
        assert time.monotonic() - started < SLOW_S - 0.5  # `longest` bounds the wait
        assert slow.result().headers["connection"] == "close"
