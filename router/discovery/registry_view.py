"""The node registry as the router reads it: every record, refreshed in the background, found by URL.

Discovery says where nodes are; the registry says what they call themselves (the names the prefix index
uses) and how loaded they are. The two are joined by the node's HTTP URL.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kvferry.kvcache.node_registry import PeerRegistry

log = logging.getLogger(__name__)


def normalize_url(url: str) -> str:
    return url.rstrip("/")


class RegistryView:
    def __init__(self, registry: PeerRegistry | None, stale_after_seconds: float) -> None:
        self.registry = registry
        self.stale_after_seconds = stale_after_seconds
        self._by_url: dict[str, tuple[str, dict[str, Any]]] = {}

    def refresh(self) -> None:
        """Read every record (blocking: run it off the event loop). A failed read keeps the last view."""
        if self.registry is None:
            return
        try:
            records = self.registry.records()
        except Exception as exc:  # noqa: BLE001 - a registry outage must not stop routing
            log.warning("could not read the node registry: %s", exc)
            return
        self._by_url = {
            normalize_url(str(record["url"])): (name, record) for name, record in records.items() if record.get("url")
        }

    def lookup(self, url: str) -> tuple[str, dict[str, Any]] | None:
        return self._by_url.get(normalize_url(url))

    def records(self) -> list[tuple[str, dict[str, Any]]]:
        return list(self._by_url.values())

    def is_stale(self, record: dict[str, Any], now: float | None = None) -> bool:
        """A record whose heartbeats stopped (a folder registry keeps dead nodes' files)."""
        updated = record.get("updated_at")
        if not isinstance(updated, int | float):
            return False
        return (now if now is not None else time.time()) - updated > self.stale_after_seconds
