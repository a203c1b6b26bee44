"""The decode nodes' token streams, read through aiohttp rather than the httpx client of the other node calls.

Every token of every stream passes here. httpx's connection pool scans all of its connections (a socket
readability syscall for each idle one) for every queued request whenever a request starts or ends: with 64
streams open that was about 12 ms of the router's CPU per request, spent on its one event loop while other
streams waited, and its pure-Python HTTP reader cost tens of microseconds per token. aiohttp keeps idle
connections per host in a queue and parses HTTP in C (docs/router.md, overhead).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson

from kvferry.internal_api import CALLER_KEEPALIVE_SECONDS
from kvferry.request_id import request_id_headers

CONNECT_SECONDS = 5.0  # as the router's other node calls; a stream itself may run as long as it runs
JSON_HEADERS = {"Content-Type": "application/json"}
StreamErrors = aiohttp.ClientError  # what a failed call or a broken stream raises


class NodeStreams:
    def __init__(self, headers: Mapping[str, str], tls: ssl.SSLContext | None = None,
                 server_name: str | None = None) -> None:
        """`headers`: sent on every call (the cluster token). `tls`: the context that trusts the nodes over
        HTTPS, `server_name` the name their certificates carry (kvferry/tls/client.py)."""
        self.headers = dict(headers)
        self.tls, self.server_name = tls, server_name
        self._session: aiohttp.ClientSession | None = None

    def post(self, url: str, body: dict[str, Any], headers: Mapping[str, str]) -> Any:  # `async with` a ClientResponse
        """`headers`: the call's own (trace context), beside the session's and the request id."""
        if self._session is None:  # made on first use: a session belongs to the running event loop
            self._session = aiohttp.ClientSession(
                headers=self.headers, timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_SECONDS),
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=CALLER_KEEPALIVE_SECONDS,
                                               ssl=self.tls if self.tls is not None else True),
            )
        return self._session.post(url, data=orjson.dumps(body), headers={**JSON_HEADERS, **request_id_headers(), **headers},
                                  server_hostname=self.server_name)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def ndjson_batches(content: aiohttp.StreamReader) -> AsyncIterator[list[Any]]:
    """The JSON lines of a node's stream, parsed, in batches: every line that one read completed. A relay
    that fell behind finds several tokens of a stream waiting, and hands them on in one write instead of
    one each. Lines may fall across reads however they like (no line length limit)."""
    rest = b""
    while piece := await content.readany():  # b"": the end of the stream
        if rest:
            piece, rest = rest + piece, b""
        if not piece.endswith(b"\n"):  # a line cut short: its rest comes with a later read
            piece, _, rest = piece.rpartition(b"\n")
        batch = [orjson.loads(line) for line in piece.split(b"\n") if line.strip()]
        if batch:
            yield batch
    if rest.strip():
        yield [orjson.loads(rest)]
