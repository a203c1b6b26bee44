"""The router's view of nodes: registry records joined to discovered URLs, unknown load left unknown,
stale or unhealthy records and failing nodes ejected, with a backoff that doubles."""

from __future__ import annotations

import time
from collections import Counter

import httpx

from kvferry.kvcache.node_registry import InMemoryRegistry
from kvferry.router.discovery import cluster as cluster_module
from kvferry.router.discovery.cluster import ClusterState, node_view
from kvferry.router.discovery.health import HealthTracker
from kvferry.router.discovery.nodes import Endpoint
from kvferry.router.discovery.registry_view import RegistryView
from kvferry.router.discovery.sources import RegistryDiscovery, StaticDiscovery
from kvferry.router.scheduling import POLICIES, Scheduler, SchedulingRequest


def record(url: str, role: str, **fields) -> dict:
    return {"address": "00", "role": role, "url": url, "pool": {"model": "m", "block_size": 32}, "updated_at": time.time(),
            **fields}


def test_records_join_discovered_urls_and_missing_load_stays_unknown():
    registry = InMemoryRegistry()
    registry.publish("p-a", record("http://10.0.0.1:8100/", "prefill", free_blocks=5, total_blocks=10, waiting=2))
    registry.publish("d-a", record("http://10.0.0.2:8100", "decode"))
    view = RegistryView(registry, stale_after_seconds=15)
    view.refresh()
    endpoints = StaticDiscovery(["http://10.0.0.1:8100"], ["http://10.0.0.2:8100", "http://10.0.0.3:8100"]).endpoints()
    nodes = [node_view(e, view.lookup(e.url), healthy=True, inflight=1) for e in endpoints]
    assert [(n.name, n.role, n.model, n.block_size) for n in nodes] == [
        ("p-a", "prefill", "m", 32), ("d-a", "decode", "m", 32), ("http://10.0.0.3:8100", "decode", None, None),
    ]
    assert (nodes[0].free_blocks, nodes[0].total_blocks, nodes[0].queue_depth) == (5, 10, 3)
    assert (nodes[1].free_blocks, nodes[1].waiting, nodes[1].queue_depth) == (None, None, 1)
    # Nodes with equal pools exchange KV; a record without a pool says nothing about it.
    assert nodes[0].kv_identity == nodes[1].kv_identity is not None and nodes[2].kv_identity is None


def test_a_router_sees_only_nodes_that_read_its_token_ids():
    registry = InMemoryRegistry()
    registry.publish("same", record("http://10.0.0.1:8100", "decode", tokenizer="t1"))
    registry.publish("other", record("http://10.0.0.2:8100", "decode", tokenizer="t2"))
    registry.publish("unsaid", record("http://10.0.0.3:8100", "decode"))
    view = RegistryView(registry, stale_after_seconds=15)
    view.refresh()
    discovery = StaticDiscovery([], ["http://10.0.0.1:8100", "http://10.0.0.2:8100", "http://10.0.0.3:8100"])
    cluster = ClusterState(discovery, view, HealthTracker(), 1.0, httpx.AsyncClient(), tokenizer="t1")
    assert [node.name for node in cluster.views()] == ["same", "unsaid"]


def test_a_pool_with_other_weights_has_another_kv_identity():
    registry = InMemoryRegistry()
    registry.publish("p-a", record("http://10.0.0.1:8100", "prefill", pool={"model": "m", "weights": "a"}))
    registry.publish("d-b", record("http://10.0.0.2:8100", "decode", pool={"model": "m", "weights": "b"}))
    view = RegistryView(registry, stale_after_seconds=15)
    view.refresh()
    prefill, decode = (node_view(e, view.lookup(e.url), True, 0)
                       for e in StaticDiscovery(["http://10.0.0.1:8100"], ["http://10.0.0.2:8100"]).endpoints())
    assert not prefill.exchanges_kv_with(decode)


def test_stale_or_unhealthy_records_mark_their_node_dead_and_registry_discovery_skips_stale_ones():
    registry = InMemoryRegistry()
    registry.publish("old", record("http://o:1", "decode", updated_at=time.time() - 60))
    registry.publish("sick", record("http://s:1", "decode", healthy=False))
    registry.publish("fine", record("http://f:1", "prefill"))
    registry.publish("router-ish", {"address": "00", "url": "http://x:1"})  # no role: not a node to route to
    view = RegistryView(registry, stale_after_seconds=15)
    view.refresh()
    assert sorted(RegistryDiscovery(view).endpoints(), key=lambda e: e.url) == [
        Endpoint("http://f:1", "prefill"), Endpoint("http://s:1", "decode"),
    ]
    health = {url: node_view(Endpoint(url, "decode"), view.lookup(url), True, 0,
                             stale=view.is_stale(view.lookup(url)[1])).healthy for url in ("http://o:1", "http://s:1", "http://f:1")}
    assert health == {"http://o:1": False, "http://s:1": False, "http://f:1": True}


def test_a_registry_that_fails_keeps_the_last_view():
    class Flaky(InMemoryRegistry):
        broken = False

        def records(self):
            if self.broken:
                raise ConnectionError("redis is down")
            return super().records()

    registry = Flaky()
    registry.publish("n", record("http://n:1", "decode"))
    view = RegistryView(registry, stale_after_seconds=15)
    view.refresh()
    registry.broken = True
    view.refresh()
    assert view.lookup("http://n:1")[0] == "n"


def test_failures_eject_with_a_doubling_backoff_and_one_success_readmits():
    health = HealthTracker(first_backoff=1.0, max_backoff=3.0)
    url = "http://n:1"
    assert health.is_healthy(url) and health.due_for_probe(url, now=0.0)
    health.record_success(url)  # it has been up once: from now on failures back off
    health.record_failure(url, now=10.0)
    assert not health.is_healthy(url)
    assert not health.due_for_probe(url, now=10.9) and health.due_for_probe(url, now=11.0)
    health.record_failure(url, now=11.0)  # second failure in a row: 2 s
    assert not health.due_for_probe(url, now=12.9) and health.due_for_probe(url, now=13.0)
    health.record_failure(url, now=13.0)  # capped at 3 s
    assert not health.due_for_probe(url, now=15.9) and health.due_for_probe(url, now=16.0)
    health.record_success(url)
    assert health.is_healthy(url)


def test_calls_that_fail_together_while_the_node_is_ejected_double_its_backoff_once():
    """A decode node that dies under 16 streams fails 16 calls at once: one failure, or the router would
    wait 2^16 s (capped) before it probed the restarted node."""
    health = HealthTracker(first_backoff=1.0, max_backoff=30.0)
    url = "http://n:1"
    health.record_success(url)
    for _ in range(16):
        health.record_failure(url, now=10.0)
    assert health.due_for_probe(url, now=11.0)
    health.record_failure(url, now=11.0)  # its probe fails: the next backoff doubles
    assert not health.due_for_probe(url, now=12.9) and health.due_for_probe(url, now=13.0)


def test_a_node_that_never_answered_is_probed_every_round_while_it_starts():
    """A router started before its nodes must take them as soon as they are up, not 30 s later."""
    health = HealthTracker(first_backoff=1.0, max_backoff=30.0)
    url = "http://starting:1"
    for second in range(10):  # ten refused probes in a row: no backoff grows
        health.record_failure(url, now=float(second))
        assert not health.due_for_probe(url, now=second + 0.9) and health.due_for_probe(url, now=second + 1.0)
    health.record_success(url)
    assert health.is_healthy(url)


def two_decode_nodes() -> tuple[ClusterState, list[str]]:
    urls = ["http://10.0.0.2:8100", "http://10.0.0.3:8100"]
    registry = InMemoryRegistry()
    for index, url in enumerate(urls):
        registry.publish(f"d{index}", record(url, "decode"))
    view = RegistryView(registry, stale_after_seconds=15)
    view.refresh()
    return ClusterState(StaticDiscovery([], urls), view, HealthTracker(), 1.0, httpx.AsyncClient()), urls


def test_a_burst_counts_each_request_from_its_scheduling_and_spreads_over_the_decode_nodes():
    cluster, (d0, d1) = two_decode_nodes()
    scheduler = Scheduler(POLICIES["default"])
    cluster.inflight.update({d0: 1, d1: 3})  # streams already open
    picked = Counter()
    for _ in range(6):  # scheduled before any of their streams opens (track)
        decode = scheduler.schedule(SchedulingRequest(model="m", num_prompt_tokens=40, num_blocks=2), cluster.views()).decode
        cluster.schedule(decode.url)
        picked[decode.name] += 1
    # Counted from the scheduling, the six even the load out (5 and 5); counted only from their streams, all
    # six saw d0 with 1 and d1 with 3 in flight and went to d0.
    assert picked == {"d0": 4, "d1": 2}
    assert [node.inflight for node in cluster.views()] == [5, 5]


def test_a_scheduled_request_is_taken_over_by_its_call_or_stops_counting_after_a_while(monkeypatch):
    cluster, (d0, _) = two_decode_nodes()
    cluster.schedule(d0)
    assert cluster.views()[0].inflight == 1
    with cluster.track(d0):  # its call started: counted once, by the call
        assert cluster.views()[0].inflight == 1
    assert cluster.views()[0].inflight == 0
    cluster.schedule(d0)  # a call that never starts (the client left first)
    now = time.monotonic()
    monkeypatch.setattr(cluster_module.time, "monotonic", lambda: now + cluster_module.SCHEDULED_SECONDS + 0.1)
    assert cluster.views()[0].inflight == 0
