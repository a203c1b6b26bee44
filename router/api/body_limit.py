"""413 for request bodies over the limit, whether they announce their length or arrive chunked."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvferry.router.api.errors import APIError


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body is larger than {self.max_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._too_large().response()(scope, receive, send)
            return
        # Read the body here (the app reads all of it anyway) and hand it on once it is known to fit.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                await self._too_large().response()(scope, receive, send)
                return
        body, delivered = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # then the disconnect, when it comes

        await self.app(scope, replay, send)
