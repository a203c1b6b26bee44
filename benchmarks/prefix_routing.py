"""Prefix-cache-aware routing against round robin, least load and the default policy, and the router's overhead.

Part 1, policies: 2 prefill nodes (pinned to cores 0 and 1, one torch thread each) and 1 decode node, with
a router per policy over the same nodes, all routers sharing the cluster's Redis prefix index. The
workload is shared-prefix (groups x prompts per group, long system prompts, short questions and answers)
whose system prompts together need more KV blocks than one prefill node holds: a policy that keeps each
group on one node hits its cache; one that spreads groups over both nodes makes each node hold all of
them, and evicts. Each policy gets its own prompts (another seed), so no run finds the previous one's
prefixes cached. The offered rate is a fraction (0.9) of the capacity measured through the prefix policy
(half the groups, every request sent at once); the ideal-hit capacity from unloaded TTFTs of a miss and a
hit is recorded beside it. Hit rate: prompt tokens the prefill nodes found cached over
prompt tokens they looked up (their Prometheus counters, read before and after each run).

Part 2, overhead: the tiny model on one decode node; 64 concurrent streams sent through a colocated
router, and straight to the decode node's own generate call, in alternating rounds: p50 TTFT and ITL.

    .venv/bin/python -m benchmarks.prefix_routing           # -> benchmarks/results/prefix_routing.json
    .venv/bin/python -m benchmarks.prefix_routing --quick   # tiny model, a few requests: a smoke run
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import cached_model, environment
from benchmarks.harness.plot import pyplot_or_none
from benchmarks.harness.processes import cpu_seconds
from benchmarks.harness.results import new_result, read_result, write_result
from benchmarks.harness.table import print_table
from benchmarks.serving_cluster import NodeSpec, RouterSpec, ServingCluster, counter_total, offer
from kvferry.engine.tokenizer import ModelTokenizer
from kvferry.loadgen.client import Endpoint
from kvferry.loadgen.datasets import (
    RandomSpec,
    SharedPrefixSpec,
    TokenWords,
    random_requests,
    shared_prefix_requests,
    with_token_ids,
)
from kvferry.loadgen.metrics import Slo, summarize
from kvferry.loadgen.runner import LoadShape, RunResult

PLOT = Path(__file__).resolve().parent.parent / "docs" / "img" / "prefix_routing.png"
POLICIES = ("prefix", "round_robin", "least_load", "default")
PREFILL_NODES = ("prefill-0", "prefill-1")
MAX_MODEL_LEN = 1024
HIT_COUNTER, QUERY_COUNTER = "kvferry:prefix_cache_hits_tokens", "kvferry:prefix_cache_queries_tokens"


@dataclass(frozen=True)
class Workload:
    groups: int
    prompts_per_group: int
    system_len: int
    question_len: int
    output_len: int

    def spec(self) -> SharedPrefixSpec:
        return SharedPrefixSpec(
            self.groups, self.prompts_per_group, self.system_len, self.question_len, self.output_len
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, "prefix_routing")
    parser.add_argument("--size", default="small", help="make-model size of the llama checkpoint (part 1)")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--prompts-per-group", type=int, default=16)
    parser.add_argument("--system-len", type=int, default=512)
    parser.add_argument("--question-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument(
        "--prefill-kv-blocks",
        type=int,
        default=320,
        help="each prefill node's KV pool, in 16-token blocks (the groups' prefixes need more)",
    )
    parser.add_argument(
        "--decode-kv-blocks", type=int, default=8192, help="the decode node's KV pool, in blocks"
    )
    # The issue's comparison is "when the offered load is near the prefill nodes' capacity": the capacity the
    # cluster shows with the prefix policy, all requests sent at once.
    parser.add_argument("--load-factor", type=float, default=0.9, help="offered rate / measured capacity")
    parser.add_argument("--streams", type=int, default=64, help="concurrent streams of the overhead part")
    parser.add_argument("--overhead-rounds", type=int, default=3)
    # Equal lengths make a closed loop move in lock-step waves: every stream ends in the same step and all
    # of them arrive again at once. Lengths spread around 64 let streams end and start at different times.
    parser.add_argument(
        "--overhead-range-ratio",
        type=float,
        default=0.5,
        help="overhead part: prompt and output lengths drawn from 64 x [1 - r, 1 + r]",
    )
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--quick", action="store_true", help="tiny model, few requests, one overhead round")
    parser.add_argument(
        "--part",
        choices=("all", "policies", "overhead"),
        default="all",
        help="run one part only; the other part's results stay as the results file has them",
    )
    return parser.parse_args(argv)


def prefix_counters(node_urls: list[str]) -> tuple[float, float]:
    """(hit tokens, looked-up tokens) over the prefill nodes."""
    return counter_total(node_urls, HIT_COUNTER), counter_total(node_urls, QUERY_COUNTER)


def ideal_capacity(
    routers: dict[str, Endpoint], words: TokenWords, workload: Workload, time_limit: float
) -> dict[str, float]:
    """Unloaded TTFT of a prompt whose prefix is not cached and of one whose prefix is, and the request rate
    two prefill nodes sustain when every group misses once and then always hits."""
    probe = Workload(6, 3, workload.system_len, workload.question_len, workload.output_len)
    requests = sorted(shared_prefix_requests(words, probe.spec(), seed=1000), key=lambda r: r.system_prompt)
    one_at_a_time = LoadShape(concurrency=1, time_limit_s=time_limit)
    # Warm-up through round robin, which alternates the prefill nodes: each runs misses and hits before
    # the measurement. A node's first prefills of each kind are slow (first-use allocations and kernel
    # set-up): when the warm-up all landed on one node and the measured group on the other, one run
    # measured 3.8 s for a miss and 1.6 s for a hit instead of 1.3 and 0.2, and offered a sixth of the load.
    offer(routers["round_robin"], requests[:6], one_at_a_time)
    # Four fresh groups through the prefix policy (a miss, then two hits, each): medians of 4 and of 8.
    ttfts = [r.ttft_s for r in offer(routers["prefix"], requests[6:], one_at_a_time).records]
    miss, hit = statistics.median(ttfts[0::3]), statistics.median(ttfts[1::3] + ttfts[2::3])
    requests_total = workload.groups * workload.prompts_per_group
    mean_cost = (workload.groups * miss + (requests_total - workload.groups) * hit) / requests_total
    return {
        "miss_ttft_s": miss,
        "hit_ttft_s": hit,
        "ideal_capacity_rps": len(PREFILL_NODES) / mean_cost,
        "probe_ttfts_s": [round(t, 4) for t in ttfts],
    }


def measured_capacity(router: Endpoint, words: TokenWords, workload: Workload, time_limit: float) -> float:
    """Requests/s the cluster completes through the prefix policy with every request sent at once: half the
    workload's groups, each with all its prompts, fresh prefixes. The ideal-hit estimate counts the prefill
    nodes' cores alone; the decode node, the routers and the load generator share the same two cores."""
    half = Workload(
        max(1, workload.groups // 2),
        workload.prompts_per_group,
        workload.system_len,
        workload.question_len,
        workload.output_len,
    )
    result = offer(
        router, shared_prefix_requests(words, half.spec(), seed=2000), LoadShape(math.inf, None, time_limit)
    )
    return sum(r.error is None for r in result.records) / result.duration_s


def policy_rows(
    model: Path, words: TokenWords, workload: Workload, args: argparse.Namespace
) -> tuple[list[dict], dict, list[RunResult]]:
    # A pool must hold one whole sequence of max_model_len; the workload's prompts are far shorter.
    small_pool = ("--num-kv-blocks", str(args.prefill_kv_blocks), "--max-model-len", str(MAX_MODEL_LEN))
    nodes = [NodeSpec("prefill", name, core=core, args=small_pool) for core, name in enumerate(PREFILL_NODES)]
    # The decode node holds a reservation for every request queued on a prefill node: room for all of them,
    # so that a policy that builds long prefill queues is measured by its TTFT, not refused by the decode node.
    nodes.append(NodeSpec("decode", "decode-0", args=("--num-kv-blocks", str(args.decode_kv_blocks))))
    routers = [RouterSpec(policy, ("--policy", policy), with_index=True) for policy in POLICIES]
    rows, results = [], []
    with ServingCluster(model, nodes, routers) as cluster:
        prefill_urls = [cluster.node_urls[name] for name in PREFILL_NODES]
        endpoints = {policy: Endpoint(cluster.router_urls[policy], model.name) for policy in POLICIES}
        measured = ideal_capacity(endpoints, words, workload, args.time_limit)
        measured["measured_capacity_rps"] = measured_capacity(
            endpoints["prefix"], words, workload, args.time_limit
        )
        rate = args.load_factor * measured["measured_capacity_rps"]
        print(f"unloaded: {measured}; offered rate {rate:.3f} requests/s", flush=True)
        for seed, policy in enumerate(POLICIES):
            requests = shared_prefix_requests(words, workload.spec(), seed=seed)
            before, load_before = prefix_counters(prefill_urls), os.getloadavg()[0]
            result = offer(endpoints[policy], requests, LoadShape(rate, None, args.time_limit, seed))
            after = prefix_counters(prefill_urls)
            summary = summarize(result.records, result.duration_s, Slo())
            looked_up = after[1] - before[1]
            rows.append(
                {
                    "variant": policy,
                    "policy": policy,
                    "ttft_p50_s": round(summary["ttft_s"]["p50"], 4),
                    "ttft_p90_s": round(summary["ttft_s"]["p90"], 4),
                    "output_tok_s": round(summary["output_tok_s"], 2),
                    "request_throughput_rps": round(summary["request_throughput_rps"], 3),
                    "hit_rate": round((after[0] - before[0]) / looked_up, 3) if looked_up else None,
                    "completed": summary["completed"],
                    "failed": summary["failed"],
                    "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                    "errors": summary["errors"],
                }
            )
            results.append(result)
            print(f"  {policy}: {rows[-1]}", flush=True)
    return rows, {**measured, "offered_rate_rps": rate}, results


def router_overhead(args: argparse.Namespace) -> dict[str, object]:
    """p50 TTFT, ITL and TPOT of `streams` concurrent streams through a colocated router and straight to the
    decode node, rounds alternating; the medians over rounds. The router has core 0 to itself, as a deployment
    gives it CPUs of its own; the decode node and this process (the load generator, ~50 us of CPU per token)
    share core 1 in both modes, so the direct mode's client sits where the router mode's does and costs the
    node the same. The router's CPU time per output token is recorded too: the latencies follow how busy
    the shared machine is, its CPU time much less so."""

    model = cached_model("llama", "tiny")
    tokenizer = ModelTokenizer(model)
    spec = RandomSpec(args.streams * 3, input_len=64, output_len=64, range_ratio=args.overhead_range_ratio)
    requests = with_token_ids(random_requests(TokenWords(tokenizer), spec, seed=7), tokenizer)
    shape = LoadShape(concurrency=args.streams, time_limit_s=args.time_limit)
    p50: dict[str, dict[str, list[float]]] = {
        mode: {"ttft": [], "itl": [], "tpot": []} for mode in ("router", "direct")
    }
    router_cpu_us_per_token: list[float] = []
    # The load generator's own CPU per token: it shares core 0 with the router, and an SSE event costs it
    # more to parse than an NDJSON line.
    client_cpu_us_per_token: dict[str, list[float]] = {"router": [], "direct": []}
    load_1m: dict[str, list[float]] = {"router": [], "direct": []}  # after each round
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {1})
    try:
        with ServingCluster(model, [NodeSpec("decode", "decode-0", core=1)], [RouterSpec(core=0)]) as cluster:
            router_pid = next(process.pid for name, process in cluster.local.processes if name == "router")
            endpoints = {
                "router": Endpoint(cluster.router_url, model.name),
                "direct": Endpoint(cluster.node_urls["decode-0"], model.name, kind="node"),
            }
            offer(endpoints["router"], requests[: args.streams], shape)  # warm-up
            for round_index in range(args.overhead_rounds):
                for mode in ("router", "direct") if round_index % 2 == 0 else ("direct", "router"):
                    cpu_before, own_before = cpu_seconds(router_pid), cpu_seconds(os.getpid())
                    result = offer(endpoints[mode], requests, shape)
                    summary = summarize(result.records, result.duration_s, Slo())
                    p50[mode]["ttft"].append(summary["ttft_s"]["p50"])
                    p50[mode]["itl"].append(summary["itl_s"]["p50"])
                    p50[mode]["tpot"].append(summary["tpot_s"]["p50"])
                    load_1m[mode].append(round(os.getloadavg()[0], 2))
                    tokens = max(sum(r.output_tokens for r in result.records if r.error is None), 1)
                    client_cpu_us_per_token[mode].append(
                        (cpu_seconds(os.getpid()) - own_before) / tokens * 1e6
                    )
                    if mode == "router":
                        router_cpu_us_per_token.append((cpu_seconds(router_pid) - cpu_before) / tokens * 1e6)
    finally:
        os.sched_setaffinity(0, affinity)
    medians = {mode: {k: statistics.median(v) for k, v in values.items()} for mode, values in p50.items()}
    return {
        "streams": args.streams,
        "rounds": args.overhead_rounds,
        "model": "llama tiny",
        "lengths": {"input": 64, "output": 64, "range_ratio": args.overhead_range_ratio},
        "cores": {"router": 0, "decode_node_and_load_generator": 1},
        "ttft_p50_s": {mode: m["ttft"] for mode, m in medians.items()},
        "itl_p50_s": {mode: m["itl"] for mode, m in medians.items()},
        "added_ttft_p50_ms": (medians["router"]["ttft"] - medians["direct"]["ttft"]) * 1000,
        "added_itl_p50_pct": (medians["router"]["itl"] / medians["direct"]["itl"] - 1) * 100
        if medians["direct"]["itl"]
        else None,
        # A relay that falls behind hands tokens on in bursts: gaps near 0 lower the ITL median while each
        # request's mean time per token (TPOT) grows, so both are kept.
        "tpot_p50_s": {mode: m["tpot"] for mode, m in medians.items()},
        "added_tpot_p50_pct": (medians["router"]["tpot"] / medians["direct"]["tpot"] - 1) * 100,
        "router_cpu_us_per_token": statistics.median(router_cpu_us_per_token),
        "load_generator_cpu_us_per_token": {
            mode: statistics.median(v) for mode, v in client_cpu_us_per_token.items()
        },
        "per_round_p50": p50,
        "per_round_router_cpu_us_per_token": router_cpu_us_per_token,
        "per_round_load_avg_1m": load_1m,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.size, args.groups, args.prompts_per_group, args.system_len = "tiny", 4, 3, 64
        args.prefill_kv_blocks, args.streams, args.overhead_rounds = 70, 8, 1
    workload = Workload(
        args.groups, args.prompts_per_group, args.system_len, args.question_len, args.output_len
    )
    model = cached_model("llama", args.size)
    words = TokenWords(ModelTokenizer(model))
    load_at_start = os.getloadavg()
    results_file = output_dir(args) / "prefix_routing.json"
    # One part alone keeps the other part's numbers from the results file.
    previous = read_result(results_file) if args.part != "all" and results_file.exists() else None
    params: dict[str, object] = dict(previous.params) if previous else {}
    rows: list[dict[str, object]] = list(previous.rows) if previous else []
    summary: dict[str, object] = dict(previous.summary) if previous else {}
    results: list[RunResult] = []
    if args.part in ("all", "policies"):
        rows, measured, results = policy_rows(model, words, workload, args)
        print_table(
            rows,
            [
                "policy",
                "ttft_p50_s",
                "ttft_p90_s",
                "output_tok_s",
                "request_throughput_rps",
                "hit_rate",
                "failed",
                "load_avg_1m",
            ],
        )
        round_robin = next(r for r in rows if r["policy"] == "round_robin")
        prefix = next(r for r in rows if r["policy"] == "prefix")
        ttft_ratio = round_robin["ttft_p90_s"] / prefix["ttft_p90_s"]
        print(f"P90 TTFT round_robin / prefix: {ttft_ratio:.2f}x")
        params["workload"] = {
            "model": f"llama {args.size}",
            **workload.__dict__,
            "prefill_kv_blocks": args.prefill_kv_blocks,
            "decode_kv_blocks": args.decode_kv_blocks,
            "prefix_blocks_needed": workload.groups * workload.system_len // 16,
            "arrivals": "poisson",
        }
        summary |= {"measured": measured, "ttft_p90_ratio_round_robin_over_prefix": round(ttft_ratio, 3)}
    if args.part in ("all", "overhead"):
        overhead = router_overhead(args)
        print(
            f"router overhead: +{overhead['added_ttft_p50_ms']:.2f} ms p50 TTFT, "
            f"{overhead['added_itl_p50_pct']:+.1f}% p50 ITL at {overhead['streams']} streams"
        )
        summary["router_overhead"] = overhead
    load_avg = {"start": list(load_at_start), "end": list(os.getloadavg())}
    environment_now = {**environment(), "load_avg": load_avg, "cpu_cores": os.cpu_count()}
    result = new_result(
        "prefix_routing",
        params,
        rows,
        baseline="prefix" if rows else None,
        summary=summary,
        environment=environment_now,
    )
    print(f"wrote {write_result(result, output_dir(args))}")
    if results:
        from kvferry.loadgen.plot import plot_runs

        plot = PLOT if not args.quick else Path(tempfile.gettempdir()) / "prefix_routing_quick.png"
        if pyplot_or_none() is not None:
            plot_runs(plot, results, list(POLICIES), Slo())
            print(f"wrote {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
