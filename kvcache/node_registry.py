"""The node registry: where each node's transfer engine publishes its record, and peers and routers
read it.

One record per node: its UCX worker address (peers connect by it), role, URL, pool layout, and the
load the node reports with every heartbeat (free and total blocks, running and waiting, epoch). The
record carries a TTL that the heartbeat refreshes, so a dead node drops out on its own. Tests and
single-process runs use the in-memory registry; processes on one host without Redis share a folder.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Protocol


class RegistryUnavailableError(Exception):
    """The registry could not be read (Redis down or restarting): unlike a record missing from it, this
    says nothing about the peer, whose last known address still holds."""


class PeerRegistry(Protocol):
    def publish(self, name: str, record: dict[str, object]) -> None: ...

    def lookup(self, name: str) -> dict[str, object] | None: ...

    def remove(self, name: str) -> None: ...

    def records(self) -> dict[str, dict[str, object]]:
        """Every live record by node name (a router's view of the cluster)."""
        ...


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

    def records(self) -> dict[str, dict[str, object]]:
        with self._lock:
            return {name: dict(record) for name, record in self._records.items()}


class RedisRegistry:
    """Records under `{prefix}{name}` as JSON, with a TTL the owner refreshes by publishing again."""

    def __init__(self, url: str, prefix: str = "kvf:node:", ttl_seconds: int = 30) -> None:
        import redis

        self._redis = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self.prefix = prefix
        self.ttl_seconds = ttl_seconds

    def publish(self, name: str, record: dict[str, object]) -> None:
        self._redis.set(self.prefix + name, json.dumps(record), ex=self.ttl_seconds)

    def lookup(self, name: str) -> dict[str, object] | None:
        import redis

        try:
            raw = self._redis.get(self.prefix + name)
        except redis.RedisError as exc:
            raise RegistryUnavailableError(f"the node registry is unreachable: {exc}") from exc
        return json.loads(raw) if raw else None

    def remove(self, name: str) -> None:
        self._redis.delete(self.prefix + name)

    def records(self) -> dict[str, dict[str, object]]:
        keys = list(self._redis.scan_iter(match=self.prefix + "*", count=1000))
        if not keys:
            return {}
        # A key may expire between SCAN and MGET: its value comes back as None and is skipped.
        values = self._redis.mget(keys)
        return {
            key.decode().removeprefix(self.prefix): json.loads(raw) for key, raw in zip(keys, values, strict=True) if raw
        }


class FileRegistry:
    """One JSON file per peer in a folder: processes on one host without Redis (a local run, a GPU box)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def publish(self, name: str, record: dict[str, object]) -> None:
        staging = self.folder / f".{name}.{os.getpid()}.tmp"
        staging.write_text(json.dumps(record))
        staging.replace(self.folder / f"{name}.json")  # atomic: readers never see half a record

    def lookup(self, name: str) -> dict[str, object] | None:
        try:
            return json.loads((self.folder / f"{name}.json").read_text())
        except FileNotFoundError:
            return None

    def remove(self, name: str) -> None:
        (self.folder / f"{name}.json").unlink(missing_ok=True)

    def records(self) -> dict[str, dict[str, object]]:
        found: dict[str, dict[str, object]] = {}
        for path in self.folder.glob("*.json"):
            if (record := self.lookup(path.stem)) is not None:  # removed meanwhile: skipped
                found[path.stem] = record
        return found


def registry_from(metadata: str | PeerRegistry) -> PeerRegistry:
    """Mooncake passes a metadata-server URL: `redis://...` selects Redis, `file:///folder` a folder of
    records shared by the processes of one host, `memory://` a registry inside this process."""
    if not isinstance(metadata, str):
        return metadata
    if metadata.startswith(("redis://", "rediss://", "unix://")):
        return RedisRegistry(metadata)
    if metadata.startswith("file://"):
        return FileRegistry(metadata.removeprefix("file://"))
    if metadata == "memory://":
        return InMemoryRegistry()
    raise ValueError(f"metadata must be a redis:// or file:// URL, memory:// or a registry object, got {metadata!r}")
