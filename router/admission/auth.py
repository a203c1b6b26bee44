"""Bearer credentials, one piece of code for two checks: the router's API keys (`Authorization: Bearer
<key>` on every route but the health probes, and /metrics unless configured otherwise) and the nodes'
cluster token (the shared secret the router sends on every call to a node's internal API). Either is
compared in constant time against every configured value."""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from kvferry.router.api.errors import APIError

# KVFERRY_API_KEYS holds a comma-separated list; the operator sets KVFERRY_API_KEY from the auth secret.
KEYS_ENV = ("KVFERRY_API_KEYS", "KVFERRY_API_KEY")
# `kvferry up` and the operator put the cluster token here (the environment, not argv: `ps` shows argv).
CLUSTER_TOKEN_ENV = "KVFERRY_CLUSTER_TOKEN"
# Kubelets and routers probe without credentials.
PROBE_PATHS = frozenset({"/health", "/ready"})


def api_keys_from(flags: Iterable[str], environ: Mapping[str, str] | None = None) -> list[str]:
    environ = os.environ if environ is None else environ
    keys = [key for key in flags if key]
    for name in KEYS_ENV:
        keys += [key.strip() for key in environ.get(name, "").split(",") if key.strip()]
    return keys


def cluster_token_from(path: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The file's content when a path is given (a mounted Secret; its trailing newline dropped), else
    KVFERRY_CLUSTER_TOKEN; None: no token, the nodes' internal API is open."""
    if path:
        token = Path(path).read_text().strip()
        if not token:
            raise ValueError(f"{path}: the cluster token file is empty")
        return token
    environ = os.environ if environ is None else environ
    return environ.get(CLUSTER_TOKEN_ENV, "").strip() or None


def bearer_headers(token: str | None) -> dict[str, str]:
    """What a client sends to present `token` (nothing when there is none)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def key_matches(presented: str, keys: list[str]) -> bool:
    # Every key is compared, matched or not, so the time taken does not tell which one came close.
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(presented.encode(), key.encode())
    return matched


class APIKeyMiddleware:
    """401 (OpenAI-shaped) unless the request bears one of `keys`, on every path but `open_paths`; no keys:
    everything is open. `credential` names what was expected, in the error and its code."""

    def __init__(self, app: ASGIApp, keys: list[str], open_paths: frozenset[str], credential: str = "API key") -> None:
        self.app, self.keys, self.open_paths = app, keys, open_paths
        self.error = APIError(
            401, f"Incorrect or missing {credential}: send `Authorization: Bearer <{credential}>`",
            code=f"invalid_{credential.lower().replace(' ', '_')}",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() == "bearer" and key_matches(token.strip(), self.keys):
            await self.app(scope, receive, send)
            return
        await self.error.response()(scope, receive, send)
