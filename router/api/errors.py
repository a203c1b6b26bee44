"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the matching status, so the
official clients raise their own classes (BadRequestError, AuthenticationError, NotFoundError, ...)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvferry.router.api.openai_schema import ErrorResponse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}
RETRY_AFTER_SECONDS = 1
log = logging.getLogger(__name__)


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.retry_after = status, message, param, code, retry_after

    def body(self) -> dict[str, object]:
        kind = ERROR_TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def overloaded(status: int, message: str) -> APIError:
    return APIError(status, message, code="overloaded", retry_after=RETRY_AFTER_SECONDS)


def _describe(error: dict) -> tuple[str, str | None]:
    location = [str(part) for part in error.get("loc", ()) if part != "body"]
    param = location[0] if location else None
    return f"{'.'.join(location) or 'body'}: {error.get('msg', 'invalid')}", param


def install_error_handlers(app: FastAPI, on_invalid_body: Callable[[], None]) -> None:
    """`on_invalid_body` counts the requests refused before a handler ran."""
    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        # OpenAI answers 400 (not FastAPI's 422) to a body that breaks the schema.
        first = exc.errors()[0] if exc.errors() else {}
        message, param = _describe(first)
        on_invalid_body()
        return APIError(400, message, param=param).response()

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        # A bug must still answer in OpenAI's shape; the traceback goes to the log.
        log.error("unexpected error", exc_info=exc)
        return APIError(500, f"internal error: {exc!r}").response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return APIError(exc.status_code, str(exc.detail)).response()


ERROR_RESPONSES: dict[int | str, dict] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in {
        400: "Bad parameters, or prompt + max_tokens beyond the model's context",
        401: "Missing or wrong API key",
        404: "Unknown model",
        409: "A node refused the request (e.g. KV pools that do not match)",
        413: "Request body too large",
        429: "Too many requests in flight (Retry-After)",
        500: "A request plugin failed, or a node's engine failed while serving the request",
        502: "A node failed while serving the request",
        503: "No node can take the request now (Retry-After)",
        504: "A node did not answer in time",
    }.items()
}
