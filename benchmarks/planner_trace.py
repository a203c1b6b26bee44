"""The autoscaling planner against fixed allocations, on Mooncake's trace over a day, in simulation.

A disaggregated cluster (planner_cluster_sim.py: FIFO prefill replicas, continuous-batching decode replicas
with a KV pool each, replicas that start in `--startup-s`) serves Mooncake's conversation requests with a
day's varying rate (planner_workload.py: the trace's hour repeated and warped onto a made-up diurnal
curve, prompts scaled to 1/16, the day compressed to `--day-hours`). Its costs are measured first on this
machine with kvferry's engine and the default model (planner_service_times.py), or read from an earlier
result (`--service-times`).

- planner: every `--interval-s` the real planner (operator/planner/plan.py) decides each role's count from
  what the interval showed, built as the operator builds it (readings.py's prefill_observation and
  decode_observation over the router's histograms and the nodes' gauges), with the policies the CRD makes
  (crd_model.PrefillAutoscaling / DecodeAutoscaling with their default cool-down and window);
- fixed: the same requests on P prefill and D decode replicas all day: for the planner's node-hours, the
  best split; and the fewest nodes (best split each) that attain what the planner attained.
A request attains its SLO when its TTFT is at most `--ttft-target-s` and its mean gap between tokens at most
`--itl-target-s`; the planner's targets are the same numbers (a p90 each). Both targets sit on the router's
histogram bounds, where the p90 the operator reads from buckets is exact. Node-hours: from a replica being
asked for (its start-up included) to its leaving, over the day. The goal (the issue's): the planner's
attainment at least the fixed allocation's with at least 25% fewer node-hours.

    .venv/bin/python -m benchmarks.planner_trace            # -> benchmarks/results/planner_trace.json, .png
    .venv/bin/python -m benchmarks.planner_trace --service-times benchmarks/results/planner_trace.json
    .venv/bin/python -m benchmarks.planner_trace --quick    # a few measured points, a one-hour day
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.plot import save_plot
from benchmarks.harness.results import new_result, params_of, write_result
from benchmarks.harness.table import print_table
from benchmarks.planner_cluster_sim import ROLES, ClusterSim, Request, Slo, attainment_by_interval
from benchmarks.planner_service_times import ServiceTimes, measure
from benchmarks.planner_workload import diurnal_requests
from kvferry.operator.crd_model import DecodeAutoscaling, PrefillAutoscaling
from kvferry.operator.planner.plan import PlannerState, ScalingPolicy, plan
from kvferry.operator.planner.readings import decode_observation, prefill_observation

GOAL_SAVING = 0.25  # the issue's: at least the fixed allocation's attainment with 25% fewer node-hours
COARSE_SHARES = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # prefill's share of a fixed total, tried first
FINE_STEPS = (-0.03, -0.02, -0.01, 0.0, 0.01, 0.02, 0.03)  # then around the best, about a replica apart
MAX_FIXED_OVER_START = 4  # the fixed search gives up beyond this many times the planner's mean replicas


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """The workload, the replicas and the targets, which planner_kwok shares."""
    parser.add_argument("--peak-rps", type=float, default=12.0, help="arrival rate at the day's peak")
    parser.add_argument("--day-hours", type=float, default=6.0, help="simulated length of the day's 24 hours")
    parser.add_argument("--prompt-scale", type=float, default=1 / 16, help="of the trace's prompt lengths")
    parser.add_argument("--startup-s", type=float, default=60.0, help="from asking for a replica to it serving")
    parser.add_argument("--interval-s", type=float, default=30.0, help="between the planner's decisions")
    parser.add_argument("--ttft-target-s", type=float, default=20.0)
    parser.add_argument("--itl-target-s", type=float, default=0.25)
    parser.add_argument("--max-replicas", type=int, default=200, help="each role's maxReplicas")
    parser.add_argument("--start-prefill", type=int, default=24, help="prefill replicas at the day's start")
    parser.add_argument("--start-decode", type=int, default=8, help="decode replicas at the day's start")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, "planner_trace")
    parser.add_argument("--quick", action="store_true", help="a few measured points, a one-hour day at 2 req/s")
    parser.add_argument("--service-times", type=Path, help="reuse the service times of this planner_trace result")
    add_cluster_arguments(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.peak_rps, args.day_hours = 2.0, 1.0
    return args


def policies(args: argparse.Namespace) -> dict[str, ScalingPolicy]:
    """What the CRD makes of `autoscaling` with these targets and its defaults."""
    return {
        "prefill": PrefillAutoscaling(max_replicas=args.max_replicas, ttft_p90_seconds=args.ttft_target_s).policy(),
        "decode": DecodeAutoscaling(max_replicas=args.max_replicas, itl_p90_seconds=args.itl_target_s).policy(),
    }


@dataclass(frozen=True)
class Interval:
    at_s: float
    arrivals_rps: float
    prefill_load: float  # prompt tokens/s
    decode_load: float  # running streams
    ttft_p90_s: float | None
    itl_p90_s: float | None
    kv_usage: float | None
    ready: dict[str, int]
    asked: dict[str, int]
    attainment: float | None  # of this interval's arrivals


@dataclass(frozen=True)
class Outcome:
    variant: str
    prefill: float  # replicas: the count, or the mean over the day
    decode: float
    node_hours: float
    attainment: float
    ttft_attainment: float
    itl_attainment: float

    def row(self) -> dict[str, Any]:
        return {key: round(value, 4) if isinstance(value, float) else value for key, value in asdict(self).items()}


def outcome(variant: str, sim: ClusterSim, slo: Slo, day_s: float) -> Outcome:
    ttft_only, gaps_only = Slo(slo.ttft_s, math.inf), Slo(math.inf, slo.mean_gap_s)
    return Outcome(variant, sim.node_seconds(day_s, ("prefill",)) / day_s, sim.node_seconds(day_s, ("decode",)) / day_s,
                   sim.node_seconds(day_s) / 3600, float(slo.attained(sim).mean()),
                   float(ttft_only.attained(sim).mean()), float(gaps_only.attained(sim).mean()))


def run_planner(requests: list[Request], times: ServiceTimes, args: argparse.Namespace, slo: Slo,
                day_s: float) -> tuple[ClusterSim, list[Interval]]:
    sim = ClusterSim(requests, times, args.startup_s)
    numbers = itertools.count()  # names unique over the day, like pods'
    asked = {"prefill": args.start_prefill, "decode": args.start_decode}
    for role, count in asked.items():
        for _ in range(count):
            sim.add_replica(role, f"{role}-{next(numbers)}", ready_s=0.0)
    rules = policies(args)
    states = {role: PlannerState.fresh(count, 0.0) for role, count in asked.items()}
    arrivals = [request.arrival_s for request in sim.requests]
    before, phases_before, timeline, arrived = sim.router_totals(), sim.prefill_phases(), [], 0
    for number in range(1, int(day_s / args.interval_s) + 1):
        now = number * args.interval_s
        sim.run_until(now)
        after = sim.router_totals()
        gauges, phases = {role: sim.gauges(role) for role in ROLES}, sim.prefill_phases()
        seen = {"prefill": prefill_observation(now, args.interval_s, before, after, gauges["prefill"],
                                               phases_before, phases),
                "decode": decode_observation(now, before, after, gauges["decode"])}
        for role in ROLES:
            # as the autoscaler does: the count in force is the one decided last
            decision = plan(rules[role], replace(states[role], replicas=asked[role]), seen[role])
            states[role], asked[role] = decision.state, decision.replicas
            live = sim.live(role)
            for _ in range(asked[role] - len(live)):
                sim.add_replica(role, f"{role}-{next(numbers)}")
            for name in reversed(live[asked[role]:]):  # the newest go first, as a ReplicaSet picks
                sim.remove_replica(role, name)
        now_arrived = bisect_right(arrivals, now)
        timeline.append(Interval(now, (now_arrived - arrived) / args.interval_s, seen["prefill"].load,
                                 seen["decode"].load, seen["prefill"].latency_p90_s, seen["decode"].latency_p90_s,
                                 seen["decode"].kv_usage, {role: gauges[role].replicas for role in ROLES},
                                 dict(asked), None))
        before, phases_before, arrived = after, phases, now_arrived
    sim.run_until(math.inf)  # the day's last requests finish on what is there
    shares = attainment_by_interval(sim, slo, args.interval_s, len(timeline))
    return sim, [replace(interval, attainment=share) for interval, share in zip(timeline, shares, strict=True)]


class FixedSweep:
    """Fixed allocations, each simulated once, remembered."""

    def __init__(self, requests: list[Request], times: ServiceTimes, slo: Slo, day_s: float) -> None:
        self.requests, self.times, self.slo, self.day_s = requests, times, slo, day_s
        self.done: dict[tuple[int, int], Outcome] = {}

    def __call__(self, prefill: int, decode: int) -> Outcome:
        if (prefill, decode) not in self.done:
            sim = ClusterSim(self.requests, self.times, startup_s=0.0)
            for role, count in (("prefill", prefill), ("decode", decode)):
                for number in range(count):
                    sim.add_replica(role, f"{role}-{number}", ready_s=0.0)
            sim.run_until(math.inf)
            self.done[prefill, decode] = outcome(f"fixed {prefill}P+{decode}D", sim, self.slo, self.day_s)
            print(f"  {self.done[prefill, decode].row()}", flush=True)
        return self.done[prefill, decode]

    def best_split(self, total: int, shares: Sequence[float]) -> Outcome:
        """The best attainment of `total` replicas split by each of `shares` (prefill's share)."""
        counts = sorted({min(total - 1, max(1, round(total * share))) for share in shares})
        return max((self(prefill, total - prefill) for prefill in counts), key=lambda o: o.attainment)

    def best_share(self, total: int) -> float:
        """Prefill's share of the best split of `total` replicas: coarse, then around the best."""
        coarse = self.best_split(total, COARSE_SHARES)
        fine = self.best_split(total, _around(coarse.prefill / total))
        return fine.prefill / total

    def fewest_reaching(self, attainment: float, start: int, share: float) -> Outcome | None:
        """The smallest total whose best split (near `share`) attains `attainment`, bracketed from `start` by
        halving or doubling and then bisected (more replicas never serve worse); None when even
        MAX_FIXED_OVER_START x `start` replicas do not."""
        def reaching(total: int) -> Outcome | None:
            tried = self.best_split(total, _around(share))
            return tried if tried.attainment >= attainment else None

        low, high, best = start, start, reaching(start)
        if best is not None:
            while low > 2 and (lower := reaching(low // 2)) is not None:
                high, best, low = low // 2, lower, low // 2
            low = max(1, low // 2)
        else:
            while best is None:
                low, high = high, high * 2
                if high > MAX_FIXED_OVER_START * start:
                    return None
                best = reaching(high)
        while high - low > 1:
            middle = (low + high) // 2
            if (tried := reaching(middle)) is not None:
                high, best = middle, tried
            else:
                low = middle
        return best


def _around(share: float) -> tuple[float, ...]:
    return tuple(share + step for step in FINE_STEPS)


def plot(timeline: list[Interval], sweep: list[Outcome], planner: Outcome, same_cost: Outcome,
         path: Path) -> Path | None:
    def draw(pyplot: Any) -> Any:
        figure, axes = pyplot.subplots(2, 2, figsize=(12, 8))
        hours = [interval.at_s / 3600 for interval in timeline]
        load, replicas, attained, costs = axes.flat
        load.plot(hours, [i.arrivals_rps for i in timeline], color="gray", linewidth=0.8)
        load.set(title="load", xlabel="simulated hours", ylabel="arrivals (req/s)")
        tokens = load.twinx()
        tokens.plot(hours, [i.prefill_load / 1000 for i in timeline], color="tab:blue", linewidth=0.8)
        tokens.set_ylabel("prompt tokens/s (thousands)", color="tab:blue")
        for role, color in (("prefill", "tab:blue"), ("decode", "tab:orange")):
            replicas.plot(hours, [i.asked[role] for i in timeline], color=color, label=f"{role} asked")
            replicas.plot(hours, [i.ready[role] for i in timeline], color=color, linestyle=":",
                          label=f"{role} ready")
        replicas.axhline(same_cost.prefill, color="tab:blue", linestyle="--", linewidth=0.7,
                         label=f"{same_cost.variant} (same node-hours)")
        replicas.axhline(same_cost.decode, color="tab:orange", linestyle="--", linewidth=0.7)
        replicas.set(title="replicas: the planner's", xlabel="simulated hours", ylabel="replicas")
        replicas.legend(fontsize=7)
        attained.plot(hours, [i.attainment for i in timeline], linewidth=0.8)
        attained.set(title="the planner's SLO attainment, per interval's arrivals", xlabel="simulated hours",
                     ylabel="attainment", ylim=(0, 1.02))
        costs.scatter([o.node_hours for o in sweep], [o.attainment for o in sweep], s=12, label="fixed P+D")
        costs.scatter([planner.node_hours], [planner.attainment], color="tab:red", marker="*", s=120,
                      label="planner")
        costs.set(title="attainment against node-hours", xlabel="node-hours", ylabel="attainment")
        costs.legend()
        figure.tight_layout()
        return figure

    return save_plot(path, draw)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    times = ServiceTimes.from_result(args.service_times) if args.service_times else measure(args.quick)
    measured_s = time.perf_counter() - started
    print(f"service times ({measured_s:.0f} s): {times.as_json()}", flush=True)
    day_s = args.day_hours * 3600
    requests = diurnal_requests(args.peak_rps, day_s, args.prompt_scale)
    slo = Slo(args.ttft_target_s, args.itl_target_s)
    sim, timeline = run_planner(requests, times, args, slo, day_s)
    planner = outcome("planner", sim, slo, day_s)
    print(f"planner: {planner.row()}", flush=True)
    sweep = FixedSweep(requests, times, slo, day_s)
    same_total = round(planner.prefill + planner.decode)
    share = sweep.best_share(same_total)
    same_cost = sweep.best_split(same_total, _around(share))
    cheapest = sweep.fewest_reaching(planner.attainment, same_total, share)
    rows = [planner.row(), {**same_cost.row(), "variant": "fixed, same node-hours"}]
    if cheapest is not None:
        rows.append({**cheapest.row(), "variant": "fixed, fewest nodes reaching the planner's attainment"})
    saving = None if cheapest is None else 1 - planner.node_hours / cheapest.node_hours
    summary = {
        "goal": f"planner attainment >= a fixed allocation's with >= {GOAL_SAVING:.0%} fewer node-hours",
        "node_hours_saved_vs_fewest_fixed": None if saving is None else round(saving, 4),
        "goal_met": saving is not None and saving >= GOAL_SAVING,
        "attainment_gain_at_same_node_hours": round(planner.attainment - same_cost.attainment, 4),
        "requests": len(requests),
        "service_times": times.as_json(),
        "fixed_sweep": [o.row() for o in sorted(sweep.done.values(), key=lambda o: o.node_hours)],
        "timeline": [asdict(interval) for interval in timeline],
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print_table(rows, list(rows[0]))
    print({key: summary[key] for key in ("node_hours_saved_vs_fewest_fixed", "goal_met",
                                          "attainment_gain_at_same_node_hours", "requests", "wall_s")})
    notes = [
        f"service times {'read from ' + str(args.service_times) if args.service_times else 'measured in this run'}"
        f" (kvferry's engine, default model, CPU, one thread); prompts scaled by {args.prompt_scale:g}",
        f"a day of 24 h played over {args.day_hours:g} simulated hours; the diurnal shape is made up, the "
        "requests are Mooncake's conversation trace (planner_workload.py)",
        f"fixed allocations' replicas serve from the start; the planner's start at {args.start_prefill}P+"
        f"{args.start_decode}D (about what the day's first hour needs) and new ones take {args.startup_s:g} s; "
        "the planner's node-hours count start-ups and drains within the day",
    ]
    folder = output_dir(args)
    result = new_result("planner_trace", params_of(args, ("results_dir", "quick")), rows, summary=summary,
                        notes=notes)
    print(f"wrote {write_result(result, folder)}")
    plot(timeline, sorted(sweep.done.values(), key=lambda o: o.node_hours), planner, same_cost,
         folder / "planner_trace.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
