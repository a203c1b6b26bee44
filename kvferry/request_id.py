"""The id of the request being served: taken from the client's `X-Request-Id` at the router (or made there),
sent on every call the router makes to a node for it, taken up again by the node, and put on every log line
written while serving it (kvferry/logs.py). One id follows a request through router, prefill and decode.
The ASGI middleware that binds it is router/api/request_id.py; this module imports nothing, so that the
log setup (and `kvferry --help`) does not load the web framework.

It lives in a context variable: asyncio copies the context into every task a request's handler starts, so
the calls and log lines of concurrent requests never mix their ids.
"""

from __future__ import annotations

from contextvars import ContextVar, Token

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


def bind_request_id(request_id: str) -> Token[str | None]:
    """Binds `request_id` for the work that follows in this context; `unbind_request_id` with the token ends it."""
    return _current.set(request_id)


def unbind_request_id(token: Token[str | None]) -> None:
    _current.reset(token)
