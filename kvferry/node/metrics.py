"""Prometheus metrics of one prefill or decode node (`GET /metrics`).

Gauges are read from the engine when scraped; counters and histograms are fed by the request handlers.
Time to first token is split by where it is spent: `queue` and `prefill` on the prefill node, the KV
`transfer` (prefill node's view: from its first byte sent to the decode node's confirmation), and the
`first_decode` step on the decode node (from the KV's activation to the first token it computes).
`kvferry:busy_seconds_total` is the time the engine spent in steps: over an interval, the fraction of it
the node was busy, which the autoscaler sizes the prefill pool from (operator/planner/plan.py).
"""

from __future__ import annotations

import asyncio

import anyio.from_thread
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Up to 80 s, as the router's TTFT: a prompt's queue and prefill on a CPU run tens of seconds, and the
# autoscaler reads the queue phase's p90 (operator/planner/readings.py), which a last bound of 30 s capped.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
TTFT_PHASES = ("queue", "prefill", "transfer", "first_decode")


def event_loop_tasks() -> int:
    """Unfinished asyncio tasks of the event loop that serves this process's HTTP routes; 0 without one.
    A sync route (as /metrics is) runs in a worker thread, so the count is taken on the loop itself:
    its task set is only safe to read there."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        try:
            return anyio.from_thread.run_sync(event_loop_tasks)
        except RuntimeError:  # not an event loop's worker thread: no loop to count
            return 0
    return len(asyncio.all_tasks())


def add_asyncio_tasks_gauge(registry: CollectorRegistry, labels: dict[str, str]) -> None:
    """`kvferry:asyncio_tasks`, counted at each scrape: nodes and router alike, so a soak can see a task leak."""
    gauge = Gauge("kvferry:asyncio_tasks", "Unfinished asyncio tasks of the serving event loop", list(labels),
                  registry=registry)
    (gauge.labels(**labels) if labels else gauge).set_function(event_loop_tasks)


class NodeMetrics:
    def __init__(self, role: str, name: str) -> None:
        # A registry per node object: tests run several nodes in one process.
        self.registry = CollectorRegistry()
        labels = {"role": role, "node": name}

        def gauge(metric: str, doc: str) -> Gauge:
            return Gauge(metric, doc, list(labels), registry=self.registry).labels(**labels)

        def counter(metric: str, doc: str) -> Counter:
            return Counter(metric, doc, list(labels), registry=self.registry).labels(**labels)

        self.waiting = gauge("kvferry:num_requests_waiting", "Requests queued for their first step")
        self.running = gauge("kvferry:num_requests_running", "Requests in the running batch")
        self.kv_usage = gauge("kvferry:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1)")
        self.prefix_queries = counter("kvferry:prefix_cache_queries_tokens", "Prompt tokens looked up in the prefix cache")
        self.prefix_hits = counter("kvferry:prefix_cache_hits_tokens", "Prompt tokens found in the prefix cache")
        self.transfer_bytes = counter("kvferry:kv_transfer_bytes", "KV bytes sent to decode nodes")
        # Writes prepared before the prefill (transfer/prepared_write.py): their data sent as prepared, or
        # withdrawn (into a device pool, the prefill's blocks split a prepared run, as prefix-cache blocks can; the
        # prefill failed).
        self._prepared_writes = {
            "sent": counter("kvferry:kv_prepared_writes_sent", "KV writes prepared before the prefill and sent so"),
            "withdrawn": counter("kvferry:kv_prepared_writes_withdrawn", "KV writes prepared before the prefill and withdrawn"),
        }
        self.received_bytes = counter("kvferry:kv_received_bytes", "KV bytes received from prefill nodes")
        self._transfer_failures = Counter("kvferry:kv_transfer_failures", "KV transfers that failed, by cause",
                                          [*labels, "reason"], registry=self.registry)
        self.local_prefills = counter("kvferry:local_prefills", "Prompts a decode node prefilled itself")
        self.busy_seconds = counter("kvferry:busy_seconds", "Seconds the engine spent in steps")
        self.aborts = counter("kvferry:aborted_requests", "Running requests aborted (client gone, router cancel)")
        self.cancelled_reservations = counter("kvferry:cancelled_reservations", "Reserved KV given up before decoding")
        self.transfer_seconds = Histogram(
            "kvferry:kv_transfer_seconds", "Duration of one request's KV transfer", list(labels),
            buckets=LATENCY_BUCKETS, registry=self.registry,
        ).labels(**labels)
        self._ttft = Histogram(
            "kvferry:ttft_phase_seconds", "Time to first token, by phase", [*labels, "phase"],
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self._labels = labels
        add_asyncio_tasks_gauge(self.registry, labels)

    def transfer_failed(self, reason: str) -> None:
        """A KV transfer failed; `reason` is the transfer error's (peer_unreachable, timeout, ...)."""
        self._transfer_failures.labels(**self._labels, reason=reason).inc()

    def prepared_write(self, outcome: str) -> None:
        """A write prepared before the prefill ended: "sent" (its data went as prepared) or "withdrawn"."""
        self._prepared_writes[outcome].inc()

    def observe_ttft(self, phase: str, seconds: float) -> None:
        if phase not in TTFT_PHASES:
            raise ValueError(f"phase must be one of {TTFT_PHASES}, got {phase!r}")
        self._ttft.labels(**self._labels, phase=phase).observe(max(0.0, seconds))

    def observe_prefix(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.prefix_queries.inc(prompt_tokens)
        self.prefix_hits.inc(cached_tokens)

    def render(self, running: int, waiting: int, blocks_in_use: int, blocks_total: int) -> bytes:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(blocks_in_use / blocks_total if blocks_total else 0.0)
        return generate_latest(self.registry)
