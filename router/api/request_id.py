"""The ASGI middleware that binds each HTTP request's id (kvferry/request_id.py) for its whole handling, on the
router and on the nodes."""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvferry import tracing
from kvferry.request_id import (
    MAX_REQUEST_ID_LENGTH,
    REQUEST_ID_HEADER,
    bind_request_id,
    unbind_request_id,
    valid_request_id,
)
from kvferry.router.api.errors import APIError


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
                refusal = APIError(400, f"X-Request-Id must be 1-{MAX_REQUEST_ID_LENGTH} visible ASCII characters",
                                   param="X-Request-Id", code="invalid_request_id")
                await refusal.response()(scope, receive, send)
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

        token = bind_request_id(request_id)
        tracing.set_attributes({"kvferry.request_id": request_id})  # on the request's span (FastAPI's)
        try:
            await self.app(scope, receive, with_id)
        finally:
            unbind_request_id(token)
