"""A router pod on its way out: `GET /drain` (the pod's preStop hook) makes every response from then on ask
its client to close the connection, then returns after `seconds`, when the kubelet sends SIGTERM.

Why: a deleted pod stops getting new connections once kube-proxy has dropped its endpoint, but clients keep
sending requests on the keep-alive connections they hold. On SIGTERM uvicorn closes the idle ones at once,
and a request sent on one just then is reset (seen in the pods tier: 2 of 34 streams when a router pod was
deleted under load). With `Connection: close` on each response during the hook's wait, every client that
sends a request in those seconds gets its answer and then a closed connection, and opens its next one to
another router.
"""

from __future__ import annotations

import asyncio

from starlette.datastructures import QueryParams
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DRAIN_PATH = "/drain"
MAX_DRAIN_WAIT_S = 60.0


class DrainingMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.draining = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == DRAIN_PATH and scope["method"] == "GET":
            await self._drain(scope, send)
            return
        if not self.draining:
            await self.app(scope, receive, send)
            return

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing)

    async def _drain(self, scope: Scope, send: Send) -> None:
        self.draining = True
        try:
            seconds = min(MAX_DRAIN_WAIT_S, max(0.0, float(QueryParams(scope["query_string"]).get("seconds", "0"))))
        except ValueError:  # the hook's own URL; anything else drains without waiting
            seconds = 0.0
        await asyncio.sleep(seconds)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": b'{"status": "draining"}'})
