"""A router pod on its way out: `GET /drain` (the pod's preStop hook) makes every response from then on ask
its client to close the connection, and returns when the connections that could still be reused are gone,
when the kubelet sends SIGTERM.

Why: a deleted pod stops getting new connections once kube-proxy has dropped its endpoint, but clients keep
sending requests on the keep-alive connections they hold. On SIGTERM uvicorn closes the idle ones at once,
and a request sent on one just then is reset (seen in the pods tier: 2 of 34 streams when a router pod was
deleted under load). With `Connection: close` on each response during the hook's wait, every client that
sends a request in those seconds gets its answer and then a closed connection, and opens its next one to
another router.

A stream that began before the call already sent its headers without `Connection: close`: its client reuses
the connection as soon as the stream ends. So the hook waits at least `seconds`, then until every such stream
has ended and its client has had `REUSE_MARGIN_S` to send its next request (which gets `Connection: close`),
at most `longest` seconds in all (the pod's drain). Seen in the pods tier before this wait: 1 of 52 requests
reset, sent on a connection whose stream ended after a 3 s hook.
"""

from __future__ import annotations

import asyncio
import time

from starlette.datastructures import QueryParams
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DRAIN_PATH = "/drain"
MAX_DRAIN_WAIT_S = 300.0
REUSE_MARGIN_S = 1.0
_POLL_S = 0.05


class DrainingMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.draining = False
        self.reusable_in_flight = 0  # requests whose response went, or may go, out without `Connection: close`

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == DRAIN_PATH and scope["method"] == "GET":
            await self._drain(scope, send)
            return
        if not self.draining:
            self.reusable_in_flight += 1
            try:
                await self.app(scope, receive, self._closing_once_draining(send))
            finally:
                self.reusable_in_flight -= 1
            return
        await self.app(scope, receive, self._closing_once_draining(send))

    def _closing_once_draining(self, send: Send) -> Send:
        """A response that starts after the drain began asks for its connection to be closed."""
        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start" and self.draining:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        return closing

    async def _drain(self, scope: Scope, send: Send) -> None:
        self.draining = True
        started = time.monotonic()
        query = QueryParams(scope["query_string"])
        seconds, longest = _seconds(query, "seconds"), _seconds(query, "longest")
        await asyncio.sleep(seconds)
        waited_for_streams = False
        while self.reusable_in_flight and time.monotonic() - started < longest:
            waited_for_streams = True
            await asyncio.sleep(_POLL_S)
        if waited_for_streams:
            await asyncio.sleep(max(0.0, min(REUSE_MARGIN_S, longest - (time.monotonic() - started))))
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": b'{"status": "draining"}'})


def _seconds(query: QueryParams, name: str) -> float:
    """A wait the hook's URL names, within [0, MAX_DRAIN_WAIT_S]; missing or unreadable, 0: drain at once."""
    try:
        return min(MAX_DRAIN_WAIT_S, max(0.0, float(query.get(name, "0"))))
    except ValueError:
        return 0.0
