"""The router's view of the cluster: discovery's endpoints joined with registry records, health and the
router's own in-flight counts, turned into NodeView snapshots for the scheduler."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterator
from typing import Any

import httpx

from kvferry.kvcache.compatibility import kv_identity
from kvferry.router.discovery.health import HealthTracker
from kvferry.router.discovery.nodes import Endpoint, NodeView
from kvferry.router.discovery.registry_view import RegistryView
from kvferry.router.discovery.sources import Discovery

log = logging.getLogger(__name__)
REGISTRY_REFRESH_SECONDS = 1.0
# A node busy enough to miss a probe's deadline is slow, not dead: it is ejected only after this many
# timeouts in a row (a refused connection or an unhealthy answer ejects at once).
PROBE_TIMEOUTS_TO_EJECT = 3
# How long a scheduled request counts on its node before its call starts (then the call counts it).
SCHEDULED_SECONDS = 5.0


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def node_view(endpoint: Endpoint, entry: tuple[str, dict[str, Any]] | None, healthy: bool, inflight: int,
              stale: bool = False) -> NodeView:
    """One node's snapshot; every load field a record lacks stays None (unknown)."""
    if entry is None:
        return NodeView(name=endpoint.url, url=endpoint.url, role=endpoint.role, healthy=healthy, inflight=inflight)
    name, record = entry
    pool = record.get("pool") if isinstance(record.get("pool"), dict) else {}
    model = record.get("model") or pool.get("model")
    return NodeView(
        name=name, url=endpoint.url, role=endpoint.role, inflight=inflight,
        healthy=healthy and not stale and record.get("healthy", True) is not False,
        model=str(model) if model else None,
        running=_int(record.get("running")), waiting=_int(record.get("waiting")),
        free_blocks=_int(record.get("free_blocks")), total_blocks=_int(record.get("total_blocks")),
        block_size=_int(pool.get("block_size")), max_model_len=_int(record.get("max_model_len")),
        kv_identity=kv_identity(pool) if pool else None,
    )


class ClusterState:
    def __init__(self, discovery: Discovery, registry: RegistryView, health: HealthTracker,
                 health_interval_seconds: float, client: httpx.AsyncClient, probe_timeout_seconds: float = 1.0,
                 tokenizer: str | None = None) -> None:
        """`tokenizer`: the router's tokenizer fingerprint; nodes whose records name another are not its
        nodes (the ids it sends would mean other text there); None takes every node."""
        self.discovery, self.registry, self.health = discovery, registry, health
        self.tokenizer = tokenizer
        self.health_interval_seconds = health_interval_seconds
        self.probe_timeout_seconds = probe_timeout_seconds
        self.client = client
        self.inflight: Counter[str] = Counter()
        self._scheduled: defaultdict[str, deque[float]] = defaultdict(deque)  # url -> when each request was scheduled
        self._probe_timeouts: dict[str, int] = {}  # probes in a row that ran out of time, by node
        self._tasks: list[asyncio.Task] = []

    def record_failure(self, url: str) -> None:
        """A call to the node at `url` failed (passive health: it may be ejected)."""
        self.health.record_failure(url)

    def views(self) -> list[NodeView]:
        return [
            node_view(endpoint, entry, self.health.is_healthy(endpoint.url),
                      self.inflight[endpoint.url] + self._scheduled_count(endpoint.url),
                      stale=entry is not None and self.registry.is_stale(entry[1]))
            for endpoint in self.discovery.endpoints()
            for entry in [self.registry.lookup(endpoint.url)]
            if self._reads_our_token_ids(entry)
        ]

    def _reads_our_token_ids(self, entry: tuple[str, dict[str, Any]] | None) -> bool:
        theirs = entry[1].get("tokenizer") if entry is not None else None
        return self.tokenizer is None or theirs is None or theirs == self.tokenizer

    def schedule(self, url: str) -> None:
        """A request was just scheduled onto the node: it counts there from now on. Its call starts a few awaits
        later (track), and a burst scheduled meanwhile would see none of it: 6 requests within 10 ms all went to
        one decode node, each seeing the other with more in flight. Taken over by the call's track; one whose
        call never starts (the client left first, or the decode node answered without a prefill) stops
        counting after SCHEDULED_SECONDS."""
        self._scheduled[url].append(time.monotonic())

    @contextlib.contextmanager
    def track(self, url: str) -> Iterator[None]:
        """Count a request as in flight on a node while the block runs (taking over its scheduled count)."""
        if self._scheduled_count(url):
            self._scheduled[url].popleft()
        self.inflight[url] += 1
        try:
            yield
        finally:
            self.inflight[url] -= 1

    def _scheduled_count(self, url: str) -> int:
        scheduled = self._scheduled[url]
        expired = time.monotonic() - SCHEDULED_SECONDS
        while scheduled and scheduled[0] < expired:
            scheduled.popleft()
        return len(scheduled)

    async def start(self) -> None:
        self.discovery.start()
        await asyncio.to_thread(self.registry.refresh)
        self._tasks = [asyncio.create_task(self._refresh_registry()), asyncio.create_task(self._probe())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.discovery.stop()

    async def _refresh_registry(self) -> None:
        while True:
            await asyncio.sleep(REGISTRY_REFRESH_SECONDS)
            await asyncio.to_thread(self.registry.refresh)

    async def _probe(self) -> None:
        while True:
            endpoints = self.discovery.endpoints()
            self.health.forget_except({endpoint.url for endpoint in endpoints})
            await asyncio.gather(*(self.probe_one(e.url) for e in endpoints if self.health.due_for_probe(e.url)))
            await asyncio.sleep(self.health_interval_seconds)

    async def probe_one(self, url: str) -> bool:
        try:
            response = await self.client.get(f"{url}/health", timeout=self.probe_timeout_seconds)
            ok = response.status_code == 200
        except httpx.TimeoutException:
            self._probe_timeouts[url] = self._probe_timeouts.get(url, 0) + 1
            if self._probe_timeouts[url] < PROBE_TIMEOUTS_TO_EJECT and self.health.is_healthy(url):
                return True
            ok = False
        except httpx.HTTPError:
            ok = False
        if ok:
            self._probe_timeouts.pop(url, None)
            if not self.health.is_healthy(url):
                log.info("node %s is healthy again", url)
            self.health.record_success(url)
        else:
            log.warning("node %s failed its health probe: ejected", url)
            self.health.record_failure(url)
        return ok
