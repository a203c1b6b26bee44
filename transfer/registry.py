"""Where transfer engines publish their UCX worker addresses, and find each other's.

The nodes' registry in Redis holds the same record beside the rest of a node's state; tests and
single-process runs use the in-memory registry.
"""

from __future__ import annotations

import json
import threading
from typing import Protocol


class PeerRegistry(Protocol):
    def publish(self, name: str, record: dict[str, object]) -> None: ...

    def lookup(self, name: str) -> dict[str, object] | None: ...

    def remove(self, name: str) -> None: ...


class InMemoryRegistry:
    def __init__(self) -> None:
        self._records: dict[str, dict[str, object]] = {}
        self._lock = threading.Lock()

    def publish(self, name: str, record: dict[str, object]) -> None:
        with self._lock:
            self._records[name] = dict(record)

    def lookup(self, name: str) -> dict[str, object] | None:
        with self._lock:
            record = self._records.get(name)
            return dict(record) if record is not None else None

    def remove(self, name: str) -> None:
        with self._lock:
            self._records.pop(name, None)


class RedisRegistry:
    """Records under `{prefix}{name}` as JSON, with a TTL the owner refreshes by publishing again."""

    def __init__(self, url: str, prefix: str = "kvf:transfer:", ttl_seconds: int = 30) -> None:
        import redis

        self._redis = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self.prefix = prefix
        self.ttl_seconds = ttl_seconds

    def publish(self, name: str, record: dict[str, object]) -> None:
        self._redis.set(self.prefix + name, json.dumps(record), ex=self.ttl_seconds)

    def lookup(self, name: str) -> dict[str, object] | None:
        raw = self._redis.get(self.prefix + name)
        return json.loads(raw) if raw else None

    def remove(self, name: str) -> None:
        self._redis.delete(self.prefix + name)


def registry_from(metadata: str | PeerRegistry) -> PeerRegistry:
    """Mooncake passes a metadata-server URL; `redis://...` selects Redis, `memory://` a local registry."""
    if not isinstance(metadata, str):
        return metadata
    if metadata.startswith(("redis://", "rediss://", "unix://")):
        return RedisRegistry(metadata)
    if metadata == "memory://":
        return InMemoryRegistry()
    raise ValueError(f"metadata must be a redis:// URL, memory:// or a registry object, got {metadata!r}")
