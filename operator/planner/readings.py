"""The planner's observations from Prometheus text: the routers' and the nodes' /metrics, scraped at the
start and the end of an interval, turned into each role's load, latency p90 and KV usage over it.

Latencies come from the routers' histograms (what clients see: TTFT for prefill, the gap between tokens
for decode), summed over every router replica and differenced over the interval, the p90 read as
Prometheus' histogram_quantile reads it (linear within the bucket). Prefill's load is the prompt tokens
the prefill nodes had to compute per second (routed minus those the prefix index said were cached);
decode's, the requests its nodes are running at the end of the interval.

Prefill's pressure is read from the prefill nodes' own TTFT phases where they report them
(`kvferry:ttft_phase_seconds`): the p90 of the interval's `queue` phase (a prompt's wait for its first
step, the part of TTFT that more replicas shorten) and the p90 of the `prefill` phase over everything the
serving nodes have computed (what a prompt costs alone: the prompt mix, which replicas do not change).
Each node's histograms are differenced by its own `node` label, as Prometheus' rate() takes each series
alone: nodes come and go between two scrapes, and a sum over a changing set is no counter. The same nodes'
busy time (`kvferry:busy_seconds_total`, the seconds their engines spent in steps) gives the interval's
busy replicas (the work the pool did, in erlangs) and, over everything they have computed, what a prompt
costs a node on average: what the planner sizes the pool from (plan.py, erlang.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from kvferry.operator.planner.plan import Observation

TTFT = "kvferry:time_to_first_token_seconds"
TOKEN_GAP = "kvferry:inter_token_latency_seconds"
PROMPT_TOKENS = "kvferry:prompt_tokens"
PREFIX_HIT_TOKENS = "kvferry:prefix_hit_tokens"
RUNNING = "kvferry:num_requests_running"
KV_USAGE = "kvferry:kv_cache_usage_perc"
TTFT_PHASE = "kvferry:ttft_phase_seconds"
BUSY = "kvferry:busy_seconds"
QUANTILE = 0.9

Buckets = dict[float, float]  # upper bound -> cumulative count


@dataclass(frozen=True)
class RouterTotals:
    """Every router replica's counters, added up, at one moment."""

    ttft: Buckets = field(default_factory=dict)
    token_gap: Buckets = field(default_factory=dict)
    prompt_tokens: float = 0.0
    prefix_hit_tokens: float = 0.0

    @classmethod
    def of(cls, scrapes: Iterable[str]) -> RouterTotals:
        ttft: Buckets = {}
        gap: Buckets = {}
        prompt = hits = 0.0
        for text in scrapes:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == f"{TTFT}_bucket":
                        _add(ttft, sample.labels["le"], sample.value)
                    elif sample.name == f"{TOKEN_GAP}_bucket":
                        _add(gap, sample.labels["le"], sample.value)
                    elif sample.name == f"{PROMPT_TOKENS}_total":
                        prompt += sample.value
                    elif sample.name == f"{PREFIX_HIT_TOKENS}_total":
                        hits += sample.value
        return cls(ttft, gap, prompt, hits)


@dataclass(frozen=True)
class NodeGauges:
    """One serving role's nodes at one moment."""

    replicas: int
    running: float  # requests in the running batches, summed
    kv_usage: float | None  # mean over the nodes

    @classmethod
    def of(cls, scrapes: list[str]) -> NodeGauges:
        running, usages = 0.0, []
        for text in scrapes:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == RUNNING:
                        running += sample.value
                    elif sample.name == KV_USAGE:
                        usages.append(sample.value)
        return cls(len(scrapes), running, sum(usages) / len(usages) if usages else None)


@dataclass(frozen=True)
class PrefillPhases:
    """The prefill nodes' `queue` and `prefill` phase histograms and busy seconds at one moment, by node name."""

    queue: dict[str, Buckets] = field(default_factory=dict)
    compute: dict[str, Buckets] = field(default_factory=dict)
    busy_s: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, scrapes: Iterable[str]) -> PrefillPhases:
        phases: dict[str, dict[str, Buckets]] = {"queue": {}, "prefill": {}}
        busy: dict[str, float] = {}
        for text in scrapes:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == f"{TTFT_PHASE}_bucket" and sample.labels.get("phase") in phases:
                        node = phases[sample.labels["phase"]].setdefault(sample.labels.get("node", ""), {})
                        _add(node, sample.labels["le"], sample.value)
                    elif sample.name == f"{BUSY}_total":
                        busy[sample.labels.get("node", "")] = sample.value
        return cls(phases["queue"], phases["prefill"], busy)

    def queue_p90_s(self, before: PrefillPhases) -> float | None:
        """The interval's wait p90: each node's histogram since `before` (a node new since then, all of it)."""
        return quantile({}, _summed(_since(before.queue.get(node, {}), buckets) for node, buckets in self.queue.items()))

    def compute_p90_s(self) -> float | None:
        """The p90 of every prompt the nodes have computed since they started."""
        return quantile({}, _summed(self.compute.values()))

    def busy_replicas(self, before: PrefillPhases, seconds: float) -> float | None:
        """Busy seconds per second over the interval, each node's counter since `before`; None where the nodes
        report none."""
        if not self.busy_s:
            return None
        done = 0.0
        for node, busy_s in self.busy_s.items():
            earlier = before.busy_s.get(node, 0.0)
            done += busy_s - earlier if busy_s >= earlier else busy_s  # a counter that went back: restarted
        return done / seconds

    def compute_mean_s(self) -> float | None:
        """What a prompt costs a node on average (its busy seconds over the prompts it computed), over
        everything the nodes that report both have done; None before any has computed one."""
        nodes = [node for node in self.busy_s if self.compute.get(node)]
        prompts = sum(self.compute[node].get(math.inf, 0.0) for node in nodes)
        return sum(self.busy_s[node] for node in nodes) / prompts if prompts else None


def _since(before: Buckets, after: Buckets) -> Buckets:
    if any(after.get(bound, 0.0) < count for bound, count in before.items()):
        return after  # the counter went back: the node restarted under the same name, all of it is new
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()}


def _summed(histograms: Iterable[Buckets]) -> Buckets:
    total: Buckets = {}
    for buckets in histograms:
        for bound, count in buckets.items():
            total[bound] = total.get(bound, 0.0) + count
    return total


def _add(buckets: Buckets, bound: str, count: float) -> None:
    key = float(bound)
    buckets[key] = buckets.get(key, 0.0) + count


def quantile(before: Buckets, after: Buckets, q: float = QUANTILE) -> float | None:
    """The q-quantile of what was observed between two readings of a cumulative histogram; None when
    nothing was. Linear within the bucket it falls in, as histogram_quantile; in the +Inf bucket, that
    bucket's lower bound (the largest finite one), as histogram_quantile too."""
    bounds = sorted(after)
    counts = [after[bound] - before.get(bound, 0.0) for bound in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower


def prefill_observation(at_s: float, seconds: float, before: RouterTotals, after: RouterTotals,
                        prefill: NodeGauges, phases_before: PrefillPhases | None = None,
                        phases_after: PrefillPhases | None = None) -> Observation:
    """Without the nodes' phases (none given, or nodes that report none) the planner reads the TTFT alone."""
    computed = (after.prompt_tokens - after.prefix_hit_tokens) - (before.prompt_tokens - before.prefix_hit_tokens)
    phases_before, phases_after = phases_before or PrefillPhases(), phases_after or PrefillPhases()
    return Observation(at_s=at_s, replicas=prefill.replicas, load=max(0.0, computed) / seconds,
                       latency_p90_s=quantile(before.ttft, after.ttft),
                       queue_p90_s=phases_after.queue_p90_s(phases_before),
                       compute_p90_s=phases_after.compute_p90_s(),
                       busy_replicas=phases_after.busy_replicas(phases_before, seconds),
                       compute_mean_s=phases_after.compute_mean_s())


def decode_observation(at_s: float, before: RouterTotals, after: RouterTotals, decode: NodeGauges) -> Observation:
    return Observation(at_s=at_s, replicas=decode.replicas, load=decode.running,
                       latency_p90_s=quantile(before.token_gap, after.token_gap), kv_usage=decode.kv_usage)

