"""What tracing costs the router: p50 TTFT and ITL of 64 concurrent streams with tracing on against off.

Two identical colocated set-ups over the tiny model, side by side in one run: a router and a decode node
with `--otlp-traces-endpoint` (every request traced: 5 router spans and 3 node spans, exported in batches
by the SDK's background thread to a local OTLP receiver, which decodes them), and a router and a decode
node without. As in the router overhead benchmark (prefix_routing.py, part 2), the routers have core 0 to
themselves, and the decode nodes and this process (the load generator, and the receiver's thread in the
"on" rounds: a collector would sit elsewhere, so "on" carries a little more than its own cost) share core
1. Rounds alternate the order (ABBA); the figures are the medians over rounds of each round's p50, and the
routers' CPU time per output token. Prompt and output lengths are drawn from 64 x [0.5, 1.5].

    PYTHONPATH=tests .venv/bin/python -m benchmarks.tracing_overhead     # -> benchmarks/results/tracing_overhead.json
    PYTHONPATH=tests .venv/bin/python -m benchmarks.tracing_overhead --quick   # 8 streams, 2 rounds: a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import cached_model, environment
from benchmarks.harness.processes import cpu_seconds
from benchmarks.harness.results import new_result, params_of, write_result
from benchmarks.harness.schema import VARIANT
from benchmarks.harness.side_by_side import side_by_side, with_ratios
from benchmarks.harness.table import print_table
from benchmarks.serving_cluster import NodeSpec, RouterSpec, ServingCluster, offer
from kvferry.engine.tokenizer import ModelTokenizer
from kvferry.loadgen.client import Endpoint
from kvferry.loadgen.datasets import BenchRequest, RandomSpec, TokenWords, random_requests, with_token_ids
from kvferry.loadgen.metrics import Slo, summarize
from kvferry.loadgen.runner import LoadShape

MODES = ("off", "on")  # "off" is the baseline
GOAL_PCT = 3.0  # the issue's: tracing adds under 3% to p50 TTFT and ITL
LENGTH = 64


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, "tracing_overhead")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10, help="rounds per mode (ABBA order)")
    parser.add_argument("--time-limit", type=float, default=300, help="seconds one round may run")
    parser.add_argument("--quick", action="store_true", help="8 streams, 2 rounds: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.streams, args.rounds = 8, 2
    return args


def _cluster(model: Any, endpoint: str) -> ServingCluster:
    traced = ("--otlp-traces-endpoint", endpoint)
    nodes = [NodeSpec("decode", "decode-off", core=1), NodeSpec("decode", "decode-on", core=1, args=traced)]
    routers = [RouterSpec("router-off", nodes=("decode-off",), core=0),
               RouterSpec("router-on", args=traced, nodes=("decode-on",), core=0)]
    return ServingCluster(model, nodes, routers)


def _measure(endpoint: Endpoint, router_pid: int, requests: list[BenchRequest], shape: LoadShape) -> dict[str, float]:
    cpu_before = cpu_seconds(router_pid)
    result = offer(endpoint, requests, shape)
    summary = summarize(result.records, result.duration_s, Slo())
    if summary["failed"]:
        raise RuntimeError(f"{summary['failed']} requests failed: {summary['errors']}")
    tokens = max(sum(record.output_tokens for record in result.records), 1)
    return {"ttft_p50_s": summary["ttft_s"]["p50"], "itl_p50_s": summary["itl_s"]["p50"],
            "tpot_p50_s": summary["tpot_s"]["p50"],
            "router_cpu_us_per_token": (cpu_seconds(router_pid) - cpu_before) / tokens * 1e6}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:  # the receiver the tests use (PYTHONPATH=tests, as the command says)
        from support.otlp_receiver import OtlpReceiver
    except ImportError as exc:
        raise SystemExit(f"run it as PYTHONPATH=tests .venv/bin/python -m benchmarks.tracing_overhead ({exc})") from None

    model = cached_model("llama", "tiny")
    tokenizer = ModelTokenizer(model)
    spec = RandomSpec(args.streams * 3, input_len=LENGTH, output_len=LENGTH, range_ratio=0.5)
    requests = with_token_ids(random_requests(TokenWords(tokenizer), spec, seed=7), tokenizer)
    shape = LoadShape(concurrency=args.streams, time_limit_s=args.time_limit)
    receiver = OtlpReceiver()
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {1})
    try:
        with _cluster(model, receiver.endpoint) as cluster:
            pids = {name: process.pid for name, process in cluster.local.processes}
            endpoints = {mode: Endpoint(cluster.router_urls[f"router-{mode}"], model.name) for mode in MODES}
            for mode in MODES:  # warm-up: first requests pay one-off costs in each process
                offer(endpoints[mode], requests[: args.streams], shape)
            measured = side_by_side({mode: (lambda mode=mode: _measure(endpoints[mode], pids[f"router-{mode}"],
                                                                       requests, shape)) for mode in MODES},
                                    rounds=args.rounds)
    finally:  # the processes flush their last spans as they exit, before the receiver stops
        os.sched_setaffinity(0, affinity)
        receiver.stop()
    spans = receiver.spans()
    traced = {"spans": len(spans), "traces": len({span.trace_id for span in spans}),
              "requests_on": args.streams + args.rounds * len(requests)}  # the warm-up's and the rounds'
    metrics = ("ttft_p50_s", "itl_p50_s", "tpot_p50_s", "router_cpu_us_per_token")
    rows = with_ratios([{VARIANT: mode, **{metric: round(statistics.median(r[metric] for r in runs), 6)
                                           for metric in metrics}}
                        for mode, runs in measured.items()], "off", metrics)
    print_table(rows, [VARIANT, *metrics, *(f"{metric}_vs_baseline" for metric in metrics)])
    on = next(row for row in rows if row[VARIANT] == "on")
    added = {metric: round((on[f"{metric}_vs_baseline"] - 1) * 100, 2) for metric in ("ttft_p50_s", "itl_p50_s")}
    print(f"tracing on: {added['ttft_p50_s']:+.2f}% p50 TTFT, {added['itl_p50_s']:+.2f}% p50 ITL "
          f"({traced['spans']} spans of {traced['traces']} traces received for {traced['requests_on']} requests; "
          f"goal under {GOAL_PCT}%)")
    result = new_result(
        "tracing_overhead", {**params_of(args), "model": "llama tiny", "lengths": f"{LENGTH} x [0.5, 1.5]",
                             "cores": {"routers": 0, "decode_nodes_and_load_generator": 1}},
        rows, baseline="off",
        summary={"added_pct": added, "goal_pct": GOAL_PCT, "received": traced, "per_round": measured},
        environment={**environment(), "load_avg_end": list(os.getloadavg())})
    print(f"wrote {write_result(result, output_dir(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
