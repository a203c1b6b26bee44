"""API keys: `Authorization: Bearer <key>` on every route but the health probes (and /metrics unless
configured otherwise), compared in constant time against every configured key."""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable

from kvferry.router.errors import APIError
from starlette.types import ASGIApp, Receive, Scope, Send

# KVFERRY_API_KEYS holds a comma-separated list; the operator sets KVFERRY_API_KEY from the auth secret.
KEYS_ENV = ("KVFERRY_API_KEYS", "KVFERRY_API_KEY")
OPEN_PATHS = frozenset({"/health", "/ready"})


def api_keys_from(flags: Iterable[str], environ: dict[str, str] | None = None) -> list[str]:
    environ = os.environ if environ is None else environ
    keys = [key for key in flags if key]
    for name in KEYS_ENV:
        keys += [key.strip() for key in environ.get(name, "").split(",") if key.strip()]
    return keys


def key_matches(presented: str, keys: list[str]) -> bool:
    # Every key is compared, matched or not, so the time taken does not tell which one came close.
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(presented.encode(), key.encode())
    return matched


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, keys: list[str], metrics_need_auth: bool) -> None:
        self.app, self.keys = app, keys
        self.open_paths = OPEN_PATHS if metrics_need_auth else OPEN_PATHS | {"/metrics"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() == "bearer" and key_matches(token.strip(), self.keys):
            await self.app(scope, receive, send)
            return
        error = APIError(401, "Incorrect or missing API key: send `Authorization: Bearer <key>`", code="invalid_api_key")
        await error.response()(scope, receive, send)
