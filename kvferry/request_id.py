"""The id of the request being served: taken from the client's `X-Request-Id` at the router (or made there),
sent on every call the router makes to a node for it, taken up again by the node, and put on every log line
written while serving it (kvferry/logs.py). One id follows a request through router, prefill and decode.

It lives in a context variable: asyncio copies the context into every task a request's handler starts, so
the calls and log lines of concurrent requests never mix their ids.
"""

from __future__ import annotations

import uuid
from contextvars import ContextVar

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID_LENGTH = 128
_current: ContextVar[str | None] = ContextVar("kvferry_request_id", default=None)


def current_request_id() -> str | None:
    return _current.get()


def request_id_headers() -> dict[str, str]:
    """`X-Request-Id` of the request being served, for a call made on its behalf; none outside one."""
    request_id = _current.get()
    return {REQUEST_ID_HEADER: request_id} if request_id is not None else {}


def valid_request_id(value: str) -> bool:
    """Visible ASCII, at most MAX_REQUEST_ID_LENGTH: it goes into headers and log lines as it is."""
    return 0 < len(value) <= MAX_REQUEST_ID_LENGTH and all("!" <= char <= "~" for char in value)


class RequestIdMiddleware:
    """Binds each HTTP request's id for its whole handling and returns it in the response's `X-Request-Id`.
    `make_missing`: the router makes an id for a request without one (or with one that is not
    `valid_request_id`, answered 400: a client that sends an id wants to find it again); a node takes
    what the router sent and otherwise has none."""

    def __init__(self, app: ASGIApp, make_missing: bool) -> None:
        self.app, self.make_missing = app, make_missing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = next((value.decode("latin-1") for key, value in scope["headers"] if key == REQUEST_ID_HEADER.encode()),
                    None)
        if sent is not None and not valid_request_id(sent):
            if self.make_missing:
                await _refuse(send, f"X-Request-Id must be 1-{MAX_REQUEST_ID_LENGTH} visible ASCII characters")
                return
            sent = None
        request_id = sent if sent is not None or not self.make_missing else uuid.uuid4().hex
        if request_id is None:
            await self.app(scope, receive, send)
            return

        async def with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (REQUEST_ID_HEADER.encode(), request_id.encode())]}
            await send(message)

        token = _current.set(request_id)
        try:
            await self.app(scope, receive, with_id)
        finally:
            _current.reset(token)


async def _refuse(send: Send, message: str) -> None:
    """400 with an OpenAI-shaped error body (the router's other refusals' shape)."""
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": "X-Request-Id",
                                   "code": "invalid_request_id"}})
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
