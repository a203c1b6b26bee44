"""The router's streaming response: Starlette's StreamingResponse without its anyio task group.

Starlette watches for a client that leaves by running the body and a disconnect listener in an anyio task
group; ending the group formats a repr of the current task (its callbacks and their source lines) into a
cancel reason, on every response. That came to ~55 us of the router's one event loop per response, against
~18 us for the two asyncio tasks here (measured alone: starlette 1.10, anyio 4.16, uvloop). The body iterator
is closed however the response ends, as kvferry.closing_response does for the nodes: its cleanup aborts the
request on the nodes, and must run now.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


async def _client_left(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class SSEResponse(StreamingResponse):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.ensure_future(self.stream_response(send))
        watcher = asyncio.ensure_future(_client_left(receive))
        try:
            await asyncio.wait((streaming, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            # The client left (or this task is being cancelled): stop the body where it is.
            watcher.cancel()
            streaming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await streaming  # its own failure, if any, is this response's
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()
