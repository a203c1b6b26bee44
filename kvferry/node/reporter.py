"""What a node tells the cluster, from a background thread: its load in the node registry (every
second) and its prefix cache in the shared prefix index (every few tens of milliseconds).

Redis being down must cost nothing but freshness: a failed load report is retried on the next tick,
and failed index writes turn into one full resynchronisation (`replace_node`) once Redis answers again,
so the index recovers without replaying lost events.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kvferry.engine import LLMEngine
from kvferry.kvcache.events import KVEvent
from kvferry.kvcache.prefix_index import PrefixIndex

log = logging.getLogger(__name__)

EVENT_FLUSH_SECONDS = 0.05
LOAD_REPORT_SECONDS = 1.0

RunLocked = Callable[[Callable[[LLMEngine], object]], object]


def load_fields(engine: LLMEngine) -> dict[str, object]:
    """The part of a node's registry record that changes: what routers weigh when they pick it."""
    now = engine.occupancy()
    return {
        "free_blocks": now.blocks.free + now.blocks.cached,
        "total_blocks": now.blocks.total,
        "running": now.running,
        "waiting": now.waiting,
    }


class NodeReporter:
    def __init__(
        self,
        name: str,
        run_locked: RunLocked,
        publish_load: Callable[[dict[str, object]], None],
        is_healthy: Callable[[], bool],
        index: PrefixIndex | None,
    ) -> None:
        self.name = name
        self._run_locked = run_locked
        self._publish_load = publish_load
        self._is_healthy = is_healthy
        self.index = index
        # The index may hold entries of an earlier process under this name: start with a full sync.
        self.needs_resync = True
        self.stats = {"index_resyncs": 0, "index_failures": 0, "load_report_failures": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"kvferry-reporter-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _loop(self) -> None:
        ticks_per_report = max(1, round(LOAD_REPORT_SECONDS / EVENT_FLUSH_SECONDS))
        tick = 0
        while not self._stop.wait(EVENT_FLUSH_SECONDS):
            self.flush_events()
            if tick % ticks_per_report == 0:
                self.report_load()
            tick += 1

    def flush_events(self) -> None:
        resync = self.needs_resync

        def drain(engine: LLMEngine) -> tuple[list[KVEvent] | None, list[int] | None]:
            events = engine.allocator.take_events()
            # The snapshot is taken under the same lock as the drain, so no event falls between them.
            return events, engine.allocator.cached_hashes() if resync or events is None else None

        events, snapshot = self._run_locked(drain)  # type: ignore[misc]
        if self.index is None:
            return
        try:
            if snapshot is not None:
                self.index.replace_node(self.name, snapshot)
                self.stats["index_resyncs"] += 1
                self.needs_resync = False
            elif events:
                self.index.apply(self.name, events)
        except Exception as exc:  # noqa: BLE001 - the index is a hint; repair it once Redis is back
            if not self.needs_resync:
                log.warning("prefix index unreachable from %s; will resync: %s", self.name, exc)
            self.stats["index_failures"] += 1
            self.needs_resync = True

    def report_load(self) -> None:
        fields = self._run_locked(load_fields)
        try:
            self._publish_load({**fields, "healthy": self._is_healthy()})  # type: ignore[dict-item]
        except Exception:  # noqa: BLE001 - the next tick tries again; the record's TTL covers the gap
            self.stats["load_report_failures"] += 1
