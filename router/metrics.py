"""The router's Prometheus metrics (one CollectorRegistry per app, so several routers can live in one
process, e.g. in tests) and the counters /stats shows as JSON."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kvferry.node.metrics import add_asyncio_tasks_gauge

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)


class BulkHistogram(Collector):
    """A histogram that takes a request's observations in one call. Every token of every stream has a gap:
    prometheus_client's Histogram.observe per token (a lock and a bucket scan each) was a measurable part of
    the router's CPU per token. Observed from the event loop's thread only; a scrape (from a worker thread)
    may see one call's observations half added, which the next scrape completes."""

    def __init__(self, name: str, documentation: str, buckets: Iterable[float], registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = [*buckets, math.inf]
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        registry.register(self)

    def observe_many(self, values: Iterable[float]) -> None:
        counts, bounds = self.counts, self.bounds
        for value in values:
            counts[bisect_left(bounds, value)] += 1  # the first bound >= value: Prometheus' `le`
            self.sum += value

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cumulative, buckets = 0, []
        for bound, count in zip(self.bounds, self.counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=self.sum)


# The time to first token of one request, in parts that add up to it: the router's own (admission, tokenizing,
# scheduling), the prefill node's as it measured them (a disaggregated prompt), the first step on the decode
# node (from its KV's arrival; a prompt it prefilled itself: from the call), and the rest (the node calls'
# round trips, the decode node's reservation, the relay of the first token). They are read on three
# processes' clocks: the prefill node hears that its last write landed a moment after the decode node began,
# so where that moment is longer than the rest, `other` is 0 and the phases exceed TTFT by it.
TTFT_PHASES = ("router", "prefill_queue", "prefill_compute", "transfer", "first_step", "other")


def ttft_phases(ttft: float, router: float, first_chunk: dict[str, Any]) -> dict[str, float]:
    """A request's TTFT phases from its first chunk (the nodes' reports on it: internal_api.StreamChunk's
    first_step_seconds, and the prefill phases pd_flow.py puts on it); `other` is what they leave."""
    phases = {"router": router, **first_chunk.get("prefill_phases", {}),
              "first_step": first_chunk.get("first_step_seconds") or 0.0}
    return {**phases, "other": max(0.0, ttft - sum(phases.values()))}


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("kvferry:time_to_first_token_seconds", "Request arrival to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = BulkHistogram("kvferry:inter_token_latency_seconds", "Gap between tokens of one stream",
                                 TOKEN_GAP_BUCKETS, r)
        self.e2e = Histogram("kvferry:e2e_request_latency_seconds", "Request arrival to last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self._ttft_phases = Histogram("kvferry:router_ttft_phase_seconds", "Time to first token of each request, "
                                      "by phase: the phases of one request add up to its TTFT", ["phase"],
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter("kvferry:router_requests", "Finished requests by HTTP status", ["status"], registry=r)
        self.prompt_tokens = Counter("kvferry:prompt_tokens", "Prompt tokens routed", registry=r)
        self.generation_tokens = Counter("kvferry:generation_tokens", "Tokens generated for finished requests, "
                                         "every choice's", registry=r)
        self.prefix_hit_tokens = Counter("kvferry:prefix_hit_tokens",
                                         "Prompt tokens the chosen node held per the prefix index", registry=r)
        self.decisions = Counter("kvferry:routing_decisions", "Scheduling decisions", ["policy", "role", "node"], registry=r)
        self.fallbacks = Counter("kvferry:local_prefill_fallbacks", "Requests a decode node prefilled itself",
                                 ["reason"], registry=r)
        self.pd_decisions = Counter("kvferry:pd_decisions", "P/D decisions: prompts disaggregated or kept on the "
                                    "decode node", ["path"], registry=r)
        self.migrations = Counter("kvferry:router_migrations", "Streams whose decode node was lost: migrated, or "
                                  "ended with an error (no other node, or migrations exhausted)", ["outcome"], registry=r)
        self.node_calls = Counter("kvferry:router_node_calls", "HTTP calls the router made to nodes, by route",
                                  ["route"], registry=r)
        self.inflight = Gauge("kvferry:router_inflight_requests", "Requests in flight in this router", registry=r)
        add_asyncio_tasks_gauge(r, {})
        self.tally: Tally[str] = Tally()  # /stats

    def request_done(self, status: int, generated_tokens: int = 0) -> None:
        self.requests.labels(status=str(status)).inc()
        self.generation_tokens.inc(generated_tokens)
        self.tally["requests"] += 1
        self.tally["generation_tokens"] += generated_tokens

    def observe_ttft_phases(self, phases: dict[str, float]) -> None:
        for phase in TTFT_PHASES:
            if phase in phases:
                self._ttft_phases.labels(phase=phase).observe(phases[phase])

    def routed(self, policy: str, role: str, node: str) -> None:
        self.decisions.labels(policy=policy, role=role, node=node).inc()

    def prefix(self, prompt_tokens: int, hit_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.prefix_hit_tokens.inc(hit_tokens)
        self.tally["prompt_tokens"] += prompt_tokens
        self.tally["prefix_hit_tokens"] += hit_tokens

    def fallback(self, reason: str) -> None:
        self.fallbacks.labels(reason=reason).inc()
        self.tally["local_prefill_fallbacks"] += 1

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def stats(self) -> dict[str, int]:
        return {key: self.tally[key] for key in ("requests", "prompt_tokens", "generation_tokens", "prefix_hit_tokens",
                                                 "local_prefill_fallbacks")}
