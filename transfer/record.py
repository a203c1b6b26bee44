"""This engine's record in the node registry: published at start, refreshed by a heartbeat, removed at close.

The record is the worker address peers connect by, plus what the node adds (role, URL, pool layout, and
the load its reporter merges in).
"""

from __future__ import annotations

import logging
import threading
import time

from kvferry.kvcache.node_registry import PeerRegistry

log = logging.getLogger(__name__)


class RecordPublisher:
    def __init__(
        self, registry: PeerRegistry, name: str, address: bytes, heartbeat_seconds: float, closing: threading.Event
    ) -> None:
        self._registry = registry
        self._name = name
        self._address = address.hex()
        self._heartbeat_seconds = heartbeat_seconds
        self._closing = closing
        self._record: dict[str, object] = {}

    def start(self, record: dict[str, object]) -> None:
        self._record = record
        try:
            self.publish(**record)
        except Exception as exc:  # noqa: BLE001 - a registry that is down now: the heartbeat publishes later
            log.warning("registry unreachable at start (%s); %s will publish once it answers", exc, self._name)
        threading.Thread(target=self._heartbeat, name=f"kvferry-transfer-heartbeat-{self._name}", daemon=True).start()

    def publish(self, **record: object) -> None:
        """(Re)publish the record: the worker address plus whatever the caller adds."""
        # updated_at lets readers of a registry without TTLs (a folder) tell a dead node's record.
        self._registry.publish(self._name, {"address": self._address, **record, "updated_at": time.time()})

    def update(self, **fields: object) -> None:
        """Merge `fields` into the record the heartbeat publishes (a node's load), and publish it now."""
        self._record = {**self._record, **fields}
        self.publish(**self._record)

    def remove(self) -> None:
        try:
            self._registry.remove(self._name)
        except Exception:  # noqa: BLE001 - a registry that is gone needs no cleanup
            log.debug("registry removal failed for %s", self._name)

    def _heartbeat(self) -> None:
        # Registry records carry a TTL so that dead engines drop out; a live one keeps refreshing it.
        while not self._closing.wait(self._heartbeat_seconds):
            try:
                self.publish(**self._record)
            except Exception:  # noqa: BLE001 - Redis down: peers keep their cached endpoints meanwhile
                log.warning("could not refresh the registry record of %s", self._name)
