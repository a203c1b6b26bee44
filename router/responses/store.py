"""Stored responses, for `previous_response_id` and GET/DELETE /v1/responses/{id}: each response's body and
the conversation up to and including its answer, kept `ttl` seconds. In Redis where the router has one (every
router replica sees every response), else in this process (bounded: the oldest go first)."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

MEMORY_STORE_LIMIT = 10_000  # responses kept in a router without Redis


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]  # the response as the API returned it
    messages: list[dict[str, Any]]  # the conversation as chat messages, this response's answer last
    session: str  # the conversation's prompt_cache_key: its next turn goes where this one went

    def dumps(self) -> bytes:
        return orjson.dumps({"body": self.body, "messages": self.messages, "session": self.session})

    @classmethod
    def loads(cls, raw: bytes) -> StoredResponse:
        value = orjson.loads(raw)
        return cls(value["body"], value["messages"], value["session"])


class ResponseStore(Protocol):
    async def get(self, response_id: str) -> StoredResponse | None: ...

    async def put(self, response_id: str, stored: StoredResponse) -> None: ...

    async def delete(self, response_id: str) -> bool: ...

    async def aclose(self) -> None: ...


class RedisResponseStore:
    def __init__(self, url: str, model: str, ttl_seconds: float) -> None:
        import redis.asyncio

        self._redis = redis.asyncio.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._prefix, self._ttl_ms = f"kvferry:{model}:response:", int(ttl_seconds * 1000)

    async def get(self, response_id: str) -> StoredResponse | None:
        raw = await self._redis.get(self._prefix + response_id)
        return StoredResponse.loads(raw) if raw is not None else None

    async def put(self, response_id: str, stored: StoredResponse) -> None:
        await self._redis.set(self._prefix + response_id, stored.dumps(), px=self._ttl_ms)

    async def delete(self, response_id: str) -> bool:
        return bool(await self._redis.delete(self._prefix + response_id))

    async def aclose(self) -> None:
        await self._redis.aclose()


class MemoryResponseStore:
    def __init__(self, ttl_seconds: float, limit: int = MEMORY_STORE_LIMIT) -> None:
        self._ttl, self._limit = ttl_seconds, limit
        self._entries: OrderedDict[str, tuple[float, StoredResponse]] = OrderedDict()

    async def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is None or entry[0] < time.monotonic():
            self._entries.pop(response_id, None)
            return None
        return entry[1]

    async def put(self, response_id: str, stored: StoredResponse) -> None:
        self._entries[response_id] = (time.monotonic() + self._ttl, stored)
        while len(self._entries) > self._limit:
            self._entries.popitem(last=False)

    async def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None

    async def aclose(self) -> None:
        self._entries.clear()


def response_store_from(redis_url: str | None, model: str, ttl_seconds: float) -> ResponseStore:
    return RedisResponseStore(redis_url, model, ttl_seconds) if redis_url else MemoryResponseStore(ttl_seconds)
