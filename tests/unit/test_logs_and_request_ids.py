"""kvferry/logs.py's two formats and kvferry/request_id.py's middleware, in process (the e2e test
tests/e2e/test_request_ids_and_logs.py follows an id through a real cluster)."""

from __future__ import annotations

import asyncio
import io
import json
import logging

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from kvferry.logs import configure_logging
from kvferry.request_id import (
    MAX_REQUEST_ID_LENGTH,
    current_request_id,
    request_id_headers,
)
from kvferry.router.api.request_id import RequestIdMiddleware


async def _echo(_: Request) -> JSONResponse:
    await asyncio.sleep(0.01)  # concurrent requests overlap here
    logging.getLogger("kvferry.test").warning("serving", extra={"fields": {"answer": 42}})
    return JSONResponse({"bound": current_request_id(), "would_send": request_id_headers()})


def _app(make_missing: bool) -> RequestIdMiddleware:
    return RequestIdMiddleware(Starlette(routes=[Route("/", _echo)]), make_missing=make_missing)


async def _get(app: RequestIdMiddleware, *headers: dict[str, str]) -> list[httpx.Response]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        return await asyncio.gather(*(client.get("/", headers=h) for h in headers))


@pytest.fixture
def logged():
    """configure_logging into a buffer, the root logger's handlers put back after."""
    root = logging.getLogger()
    kept, level = list(root.handlers), root.level
    buffer = io.StringIO()
    yield lambda fmt: configure_logging("warning", fmt, buffer) or buffer
    root.handlers[:] = kept
    root.setLevel(level)


def test_concurrent_requests_keep_their_own_ids_in_calls_and_log_lines(logged) -> None:
    buffer = logged("json")
    ids = [f"req-{n}" for n in range(8)]
    responses = asyncio.run(_get(_app(make_missing=True), *({"X-Request-Id": i} for i in ids)))
    assert [r.json()["bound"] for r in responses] == ids
    assert [r.json()["would_send"] for r in responses] == [{"x-request-id": i} for i in ids]
    assert [r.headers["x-request-id"] for r in responses] == ids
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    assert sorted(line["request_id"] for line in lines) == ids
    assert all(line["answer"] == 42 and line["level"] == "warning" and line["message"] == "serving" for line in lines)
    assert current_request_id() is None  # nothing leaks out of a request


def test_the_router_makes_a_missing_id_and_refuses_a_bad_one() -> None:
    made, too_long, spaced = asyncio.run(_get(_app(make_missing=True), {}, {"X-Request-Id": "x" * (MAX_REQUEST_ID_LENGTH + 1)},
                                              {"X-Request-Id": "a b"}))
    assert made.json()["bound"] == made.headers["x-request-id"] and len(made.headers["x-request-id"]) == 32
    for refused in (too_long, spaced):
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "X-Request-Id"


def test_a_node_binds_only_a_valid_id_it_was_sent() -> None:
    sent, none, bad = asyncio.run(_get(_app(make_missing=False), {"X-Request-Id": "r1"}, {}, {"X-Request-Id": "a b"}))
    assert sent.json()["bound"] == "r1"
    assert none.json()["bound"] is None and "x-request-id" not in none.headers
    assert bad.status_code == 200 and bad.json()["bound"] is None


def test_text_lines_carry_the_id_and_fields(logged) -> None:
    buffer = logged("text")
    asyncio.run(_get(_app(make_missing=True), {"X-Request-Id": "abc"}))
    [line] = buffer.getvalue().splitlines()
    assert line.endswith("WARNING kvferry.test [abc]: serving answer=42")
