"""A streaming response that closes its body iterator as soon as the response ends, however it ends.

Starlette cancels a streaming response when its client disconnects; if the cancellation lands while the
response awaits `send`, the body generator is left suspended and only finalised by the garbage collector,
which for a generator caught in a reference cycle can be much later. Its cleanup (aborting the request on
the engine or on a node) must run now, so the response closes it explicitly.
"""

from __future__ import annotations

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class ClosingStreamingResponse(StreamingResponse):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()
