"""A disaggregated cluster in simulated time, for the planner benchmarks (planner_trace, planner_kwok).

Not kvferry's nodes (a model of them, named so), driven by the costs measured on kvferry's engine
(planner_service_times.py):
- prefill pool: each replica a FIFO server, a prompt taking `prefill_s(prompt tokens)`; the router sends a
  request to the serving replica whose queue empties first (the least outstanding work). A request's first
  token comes with its prefill: TTFT = queueing + prefill (the KV transfer is left out);
- decode pool: continuous batching. A replica's step advances every stream it runs by one token and takes
  `step_s(streams)`; a stream holds prompt + output tokens of the replica's KV from admission to its last
  token (a reservation, as the decode node makes one). Requests wait for KV in one FIFO queue and are
  admitted to the serving replica with the most free KV. Steps are fluid (a batch that changes mid-step
  changes the step's pace at once), so a replica's next event is its next stream's end;
- replicas: a new one serves `startup_s` after it was asked for; a removed one takes no new work and leaves
  once its work is done (a decode pod's drain); node-seconds run from asking to leaving.
What the operator's planner would scrape comes out as the router's counters (RouterTotals, with the
router's own histogram buckets), each role's gauges (NodeGauges) and each prefill replica's TTFT phases
(PrefillPhases: its prompts' wait for their first step and their compute, with the node's own buckets,
observed when the prefill ends as the node observes them; and its busy seconds, the compute done so far,
which the node counts step by step), so readings.py turns them into Observations
exactly as it turns real scrapes into them.
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy

from benchmarks.planner_service_times import ServiceTimes
from kvferry.node.metrics import LATENCY_BUCKETS as NODE_LATENCY_BUCKETS
from kvferry.operator.planner.readings import Buckets, NodeGauges, PrefillPhases, RouterTotals
from kvferry.router.metrics import LATENCY_BUCKETS, TOKEN_GAP_BUCKETS

ROLES = ("prefill", "decode")
_FINISHED = 1e-6  # steps: a stream whose end is this close has ended (float sums of step fractions)


@dataclass(frozen=True)
class Request:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


class Histogram:
    """Counts per bucket of fixed bounds (+Inf last), read as Prometheus' cumulative buckets."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = (*bounds, math.inf)
        self.counts = [0.0] * len(self.bounds)

    def observe(self, value: float, count: float = 1.0) -> None:
        self.counts[bisect_left(self.bounds, value)] += count  # `le`: a value on a bound counts in its bucket

    def cumulative(self) -> Buckets:
        return dict(zip(self.bounds, itertools.accumulate(self.counts), strict=True))


@dataclass(eq=False)
class Replica:
    name: str
    created_s: float
    ready_s: float
    draining: bool = False
    gone_s: float | None = None

    def serving(self, now_s: float) -> bool:
        return self.ready_s <= now_s and not self.draining


@dataclass(eq=False)
class PrefillReplica(Replica):
    free_s: float = 0.0  # when its queue has emptied
    assigned_s: float = 0.0  # the compute of every prompt sent to it
    queue: Histogram = field(default_factory=lambda: Histogram(NODE_LATENCY_BUCKETS))  # waits for a first step
    compute: Histogram = field(default_factory=lambda: Histogram(NODE_LATENCY_BUCKETS))  # the prefills themselves

    def busy_s(self, now_s: float) -> float:
        """Compute done by `now_s`: what was sent to it less what its queue still holds (a FIFO server is busy
        without a break from now until its queue empties)."""
        return self.assigned_s - max(0.0, self.free_s - max(now_s, self.ready_s))


@dataclass(eq=False)
class DecodeReplica(Replica):
    streams: list[tuple[float, int]] = field(default_factory=list)  # heap of (progress at its end, request)
    progress: float = 0.0  # steps done since it started, fluid
    updated_s: float = 0.0
    reserved: int = 0  # KV tokens held by its streams
    version: int = 0  # of its scheduled next event; an older one is stale


class ClusterSim:
    def __init__(self, requests: Sequence[Request], times: ServiceTimes, startup_s: float) -> None:
        self.requests = sorted(requests, key=lambda request: request.arrival_s)
        self.times, self.startup_s = times, startup_s
        count = len(self.requests)
        self.ttft_s = numpy.full(count, numpy.nan)
        self.mean_gap_s = numpy.full(count, numpy.nan)  # first token to last over the gaps between them
        self.now_s = 0.0
        self.replicas: dict[str, dict[str, Replica]] = {role: {} for role in ROLES}
        self._next_arrival = 0
        self._events: list[tuple[float, int, str, object]] = []
        self._order = itertools.count()
        self._waiting: deque[int] = deque()  # prefilled requests waiting for decode KV
        self._ttft = Histogram(LATENCY_BUCKETS)
        self._gaps = Histogram(TOKEN_GAP_BUCKETS)
        self._prompt_tokens = 0.0
        # each role's serving replicas, kept until a replica is added, removed or becomes ready: routing
        # looks at them for every request
        self._serving: dict[str, tuple[float, list[Replica]]] = {}
        # routing's choices as heaps over the serving replicas: prefill's by when their queues empty, decode's
        # by KV held (an entry whose KV has changed since is stale, dropped when it comes up)
        self._by_free: list[tuple[float, int, PrefillReplica]] = []
        self._by_reserved: list[tuple[int, int, DecodeReplica]] = []
        self._step_s = [times.step_s(batch) for batch in range(times.max_batch + 1)]
        self._prefill_s = {tokens: times.prefill_s(tokens) for tokens in {r.prompt_tokens for r in self.requests}}

    # ---- replicas -----------------------------------------------------------------------------
    def add_replica(self, role: str, name: str, ready_s: float | None = None) -> None:
        """A replica asked for now; it serves at `ready_s` (default: after the start-up time)."""
        ready = self.now_s + self.startup_s if ready_s is None else ready_s
        self._serving.pop(role, None)
        if role == "prefill":
            self.replicas[role][name] = PrefillReplica(name, self.now_s, ready, free_s=ready)
        else:
            self.replicas[role][name] = DecodeReplica(name, self.now_s, ready, updated_s=ready)
            self._push(ready, "ready", name)

    def remove_replica(self, role: str, name: str) -> None:
        """It takes no new work from now and leaves when what it holds is done."""
        replica = self.replicas[role][name]
        replica.draining = True
        self._serving.pop(role, None)
        if replica.ready_s > self.now_s:
            replica.gone_s = self.now_s  # still starting: nothing to finish
        elif isinstance(replica, PrefillReplica):
            replica.gone_s = max(self.now_s, replica.free_s)
        elif not replica.streams:  # type: ignore[attr-defined]
            replica.gone_s = self.now_s

    def live(self, role: str) -> list[str]:
        """Replicas not told to leave, serving or starting, oldest first."""
        return [name for name, replica in self.replicas[role].items() if not replica.draining]

    def serving(self, role: str) -> list[Replica]:
        valid_until, serving = self._serving.get(role, (-math.inf, []))
        if self.now_s >= valid_until:
            replicas = self.replicas[role].values()
            serving = [replica for replica in replicas if replica.serving(self.now_s)]
            starts = [replica.ready_s for replica in replicas if replica.ready_s > self.now_s and not replica.draining]
            self._serving[role] = (min(starts, default=math.inf), serving)
            if role == "prefill":
                self._by_free = [(r.free_s, next(self._order), r) for r in serving]  # type: ignore[misc]
                heapq.heapify(self._by_free)
            else:
                self._by_reserved = [(r.reserved, next(self._order), r) for r in serving]  # type: ignore[misc]
                heapq.heapify(self._by_reserved)
        return serving

    def node_seconds(self, until_s: float, roles: Sequence[str] = ROLES) -> float:
        """Replicas' time from being asked for to leaving, up to `until_s`."""
        return sum(min(until_s, replica.gone_s if replica.gone_s is not None else until_s) - replica.created_s
                   for role in roles for replica in self.replicas[role].values() if replica.created_s < until_s)

    # ---- what the planner scrapes --------------------------------------------------------------
    def router_totals(self) -> RouterTotals:
        return RouterTotals(self._ttft.cumulative(), self._gaps.cumulative(), self._prompt_tokens, 0.0)

    def prefill_phases(self) -> PrefillPhases:
        serving = self.serving("prefill")
        return PrefillPhases({r.name: r.queue.cumulative() for r in serving},  # type: ignore[attr-defined]
                             {r.name: r.compute.cumulative() for r in serving},  # type: ignore[attr-defined]
                             {r.name: r.busy_s(self.now_s) for r in serving})  # type: ignore[attr-defined]

    def gauges(self, role: str) -> NodeGauges:
        serving = self.serving(role)
        if role == "prefill":
            return NodeGauges(len(serving), 0.0, None)
        usages = [self.kv_usage(replica) for replica in serving]  # type: ignore[arg-type]
        return NodeGauges(len(serving), float(sum(len(r.streams) for r in serving)),  # type: ignore[attr-defined]
                          sum(usages) / len(usages) if usages else None)

    def kv_usage(self, replica: DecodeReplica) -> float:
        return replica.reserved / self.times.kv_tokens

    # ---- time ---------------------------------------------------------------------------------
    def run_until(self, until_s: float) -> None:
        """Every arrival and event up to `until_s` (math.inf: until every request is done)."""
        while True:
            arrival = (self.requests[self._next_arrival].arrival_s if self._next_arrival < len(self.requests)
                       else math.inf)
            event = self._events[0][0] if self._events else math.inf
            at = min(arrival, event)
            if at > until_s or at == math.inf:
                break
            self.now_s = at
            if arrival <= event:
                self._arrive(self._next_arrival)
                self._next_arrival += 1
            else:
                _, _, kind, payload = heapq.heappop(self._events)
                self._handle(kind, payload)
        if until_s < math.inf:
            self.now_s = until_s
            for replica in self.replicas["decode"].values():
                self._advance(replica, until_s)  # type: ignore[arg-type]  # its gaps so far count in this interval

    def _push(self, at_s: float, kind: str, payload: object) -> None:
        heapq.heappush(self._events, (at_s, next(self._order), kind, payload))

    def _handle(self, kind: str, payload: object) -> None:
        if kind == "prefilled":
            self._prefilled(*payload)  # type: ignore[misc]
        elif kind == "ready":
            self._admit()
        else:
            name, version = payload  # type: ignore[misc]
            replica = self.replicas["decode"][name]
            if replica.version == version:  # type: ignore[attr-defined]
                self._stream_ends(replica)  # type: ignore[arg-type]

    # ---- prefill --------------------------------------------------------------------------------
    def _arrive(self, index: int) -> None:
        request = self.requests[index]
        self._prompt_tokens += request.prompt_tokens
        compute_s = self._prefill_s[request.prompt_tokens]
        if self.serving("prefill"):
            replica = heapq.heappop(self._by_free)[2]
            replica.free_s = max(self.now_s, replica.free_s) + compute_s
            heapq.heappush(self._by_free, (replica.free_s, next(self._order), replica))
        else:  # a starting replica takes work only when none serves (its queue starts when it is ready)
            starting = [r for r in self.replicas["prefill"].values() if not r.draining]
            replica = min(starting, key=lambda r: r.free_s)  # type: ignore[assignment, attr-defined]
            replica.free_s += compute_s
        replica.assigned_s += compute_s
        self._push(replica.free_s, "prefilled", (index, replica))

    def _prefilled(self, index: int, replica: PrefillReplica) -> None:
        request = self.requests[index]
        ttft = self.now_s - request.arrival_s
        self.ttft_s[index] = ttft
        self._ttft.observe(ttft)
        compute = self._prefill_s[request.prompt_tokens]
        replica.compute.observe(compute)
        replica.queue.observe(max(0.0, ttft - compute))
        if request.output_tokens <= 1:
            self.mean_gap_s[index] = 0.0  # its one token came with the prefill
            return
        self._waiting.append(index)
        self._admit()

    # ---- decode ---------------------------------------------------------------------------------
    def _need(self, request: Request) -> int:
        return min(self.times.kv_tokens, request.prompt_tokens + request.output_tokens)

    def _admit(self) -> None:
        """Waiting requests in order, each to the serving replica with the most free KV, while one fits."""
        serving = self.serving("decode")
        while self._waiting and serving:
            request = self.requests[self._waiting[0]]
            need = self._need(request)
            replica = self._most_free_kv(need)
            if replica is None:
                return  # first come, first served: the next in line waits too
            index = self._waiting.popleft()
            self._advance(replica, self.now_s)
            heapq.heappush(replica.streams, (replica.progress + request.output_tokens - 1, index))
            replica.reserved += need
            heapq.heappush(self._by_reserved, (replica.reserved, next(self._order), replica))
            # its first gap: from the token prefill gave to decode's first, the wait for KV included (one more
            # observation per stream: its steps are counted below as well)
            first_token_s = request.arrival_s + self.ttft_s[index]
            self._gaps.observe(self.now_s - first_token_s + self._step_s[len(replica.streams)])
            self._schedule(replica)

    def _most_free_kv(self, need: int) -> DecodeReplica | None:
        """The serving replica with the most free KV if `need` fits in it (then it fits nowhere else either)."""
        while self._by_reserved:
            reserved, _, replica = self._by_reserved[0]
            if replica.draining or replica.reserved != reserved:
                heapq.heappop(self._by_reserved)  # stale
                continue
            if reserved + need > self.times.kv_tokens:
                return None
            if len(replica.streams) < self.times.max_batch:
                return replica
            # a full batch with KV to spare (short streams): the next best by KV that has room
            fits = [r for r in self.serving("decode") if len(r.streams) < self.times.max_batch  # type: ignore[attr-defined]
                    and r.reserved + need <= self.times.kv_tokens]  # type: ignore[attr-defined]
            return min(fits, key=lambda r: r.reserved, default=None)  # type: ignore[attr-defined]
        return None

    def _advance(self, replica: DecodeReplica, to_s: float) -> None:
        if replica.streams and to_s > replica.updated_s:
            step = self._step_s[len(replica.streams)]
            steps = (to_s - replica.updated_s) / step
            replica.progress += steps
            self._gaps.observe(step, steps * len(replica.streams))
        replica.updated_s = max(replica.updated_s, to_s)

    def _schedule(self, replica: DecodeReplica) -> None:
        replica.version += 1
        if replica.streams:
            left = max(0.0, replica.streams[0][0] - replica.progress)
            at = replica.updated_s + left * self._step_s[len(replica.streams)]
            self._push(at, "stream ends", (replica.name, replica.version))

    def _stream_ends(self, replica: DecodeReplica) -> None:
        self._advance(replica, self.now_s)
        while replica.streams and replica.streams[0][0] <= replica.progress + _FINISHED:
            _, index = heapq.heappop(replica.streams)
            request = self.requests[index]
            first_token_s = request.arrival_s + self.ttft_s[index]
            self.mean_gap_s[index] = (self.now_s - first_token_s) / (request.output_tokens - 1)
            replica.reserved -= self._need(request)
        if replica.draining:
            if not replica.streams:
                replica.gone_s = self.now_s
        else:
            heapq.heappush(self._by_reserved, (replica.reserved, next(self._order), replica))
        self._admit()
        self._schedule(replica)


@dataclass(frozen=True)
class Slo:
    ttft_s: float  # a request attains when its TTFT is at most this
    mean_gap_s: float  # and its mean gap between tokens at most this

    def attained(self, sim: ClusterSim) -> numpy.ndarray:
        """Per request (in arrival order); one not finished does not attain."""
        with numpy.errstate(invalid="ignore"):
            return (sim.ttft_s <= self.ttft_s) & (sim.mean_gap_s <= self.mean_gap_s)


def attainment_by_interval(sim: ClusterSim, slo: Slo, interval_s: float, intervals: int) -> list[float | None]:
    """The share of each interval's arrivals that attained (None: no arrival in it)."""
    arrivals = numpy.array([request.arrival_s for request in sim.requests])
    which = numpy.minimum((arrivals // interval_s).astype(int), intervals - 1)
    attained = slo.attained(sim)
    shares: list[float | None] = []
    for interval in range(intervals):
        mine = which == interval
        shares.append(float(attained[mine].mean()) if mine.any() else None)
    return shares
