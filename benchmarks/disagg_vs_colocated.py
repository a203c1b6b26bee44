"""DistServe's toy on this machine: disaggregated prefill/decode against colocated engines, same cores.

    disaggregated: 1 prefill node on core 0 + 1 decode node on core 1, behind the router
    colocated:     2 decode nodes (no prefill node: the router's colocated mode), on cores 0 and 1
Every node runs one torch thread. The workload is prefill-heavy (long prompts, short answers). In a
colocated engine each new prompt's prefill runs in the same steps as the running requests' decodes, so
their time per output token jumps; a disaggregated decode node never prefills. The SLOs come from
measurement: each setup serves a few requests one at a time first, and the TPOT SLO is a small multiple of
the slower setup's unloaded TPOT (the TTFT SLO a larger multiple of its unloaded TTFT). The offered rates
are fractions of one core's prefill capacity (1 / unloaded TTFT). One cluster is up at a time, a fresh one
for each run, in ABBA order.

    .venv/bin/python -m benchmarks.disagg_vs_colocated           # -> benchmarks/results/disagg_vs_colocated.json
    .venv/bin/python -m benchmarks.disagg_vs_colocated --quick   # tiny model, a few requests: a smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import cached_model, environment
from benchmarks.harness.plot import pyplot_or_none
from benchmarks.harness.results import new_result, write_result
from benchmarks.harness.table import print_table
from benchmarks.serving_cluster import NodeSpec, ServingCluster, counter_total, offer
from kvferry.engine.tokenizer import ModelTokenizer
from kvferry.loadgen.client import Endpoint
from kvferry.loadgen.datasets import RandomSpec, TokenWords, random_requests
from kvferry.loadgen.metrics import Slo, summarize
from kvferry.loadgen.runner import LoadShape, RunResult

FALLBACKS = "kvferry:local_prefill_fallbacks"  # the router's count of requests a decode node prefilled itself
PLOT = Path(__file__).resolve().parent.parent / "docs" / "img" / "disagg_vs_colocated.png"
SETUPS = {
    "disaggregated": [NodeSpec("prefill", "prefill-0", core=0), NodeSpec("decode", "decode-0", core=1)],
    "colocated": [NodeSpec("decode", "decode-0", core=0), NodeSpec("decode", "decode-1", core=1)],
}
WARMUP_REQUESTS = 2  # one per node of the colocated setup
UNLOADED_REQUESTS = 4


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, "disagg_vs_colocated")
    parser.add_argument("--size", default="small", help="make-model size of the llama checkpoint")
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument(
        "--num-prompts",
        type=int,
        default=24,
        help="requests per run (16 left one request 6%% of the goodput)",
    )
    parser.add_argument(
        "--load-factors", default="0.4,0.7,0.9", help="offered rates, as fractions of 1 / unloaded TTFT"
    )
    parser.add_argument(
        "--tpot-slo-factor", type=float, default=1.5, help="TPOT SLO = this x the unloaded TPOT"
    )
    parser.add_argument(
        "--ttft-slo-factor", type=float, default=5.0, help="TTFT SLO = this x the unloaded TTFT"
    )
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny model, 6 requests, one rate")
    return parser.parse_args(argv)


def unloaded(endpoint: Endpoint, words: TokenWords, args: argparse.Namespace) -> dict[str, float]:
    """TTFT and TPOT medians of requests served one at a time, after a warm-up request per node."""
    spec = RandomSpec(WARMUP_REQUESTS + UNLOADED_REQUESTS, args.input_len, args.output_len)
    requests = random_requests(
        words, spec, seed=args.seed + 1000
    )  # not the measured prompts: no cache hits later
    offer(endpoint, requests[:WARMUP_REQUESTS], LoadShape(concurrency=1, time_limit_s=args.time_limit))
    result = offer(
        endpoint, requests[WARMUP_REQUESTS:], LoadShape(concurrency=1, time_limit_s=args.time_limit)
    )
    summary = summarize(result.records, result.duration_s, Slo())
    return {"ttft_s": summary["ttft_s"]["p50"], "tpot_s": summary["tpot_s"]["p50"]}


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def row(
    setup: str, rate: float, result: RunResult, slo: Slo, load_before: float, fallbacks: float
) -> dict[str, object]:
    summary = summarize(result.records, result.duration_s, slo)
    latency = {
        f"{name}_{p}_s": _rounded(summary[f"{name}_s"][p])
        for name in ("ttft", "tpot")
        for p in ("p50", "p90", "p99")
    }
    return {
        "variant": setup,
        "setup": setup,
        "rate_rps": round(rate, 3),
        "goodput_rps": _rounded(summary["goodput_rps"]),
        "slo_attainment": round(summary["slo_attainment"], 3),
        **latency,
        "output_tok_s": _rounded(summary["output_tok_s"]),
        "completed": summary["completed"],
        "failed": summary["failed"],
        "local_prefill_fallbacks": int(fallbacks),
        "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # before and after the run
        "errors": summary["errors"],
    }


def cluster_of(setup: str, model: Path) -> ServingCluster:
    nodes = SETUPS[setup]
    print(
        f"starting the {setup} cluster: {', '.join(f'{n.name} on core {n.core}' for n in nodes)}", flush=True
    )
    return ServingCluster(model, nodes)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.size, args.input_len, args.output_len, args.num_prompts, args.load_factors = (
            "tiny",
            64,
            8,
            6,
            "0.5",
        )
    model = cached_model("llama", args.size)
    words = TokenWords(ModelTokenizer(model))
    # Prompts of their own for each rate (the same for both setups): a prompt seen before would hit the prefix cache.
    spec = RandomSpec(args.num_prompts, args.input_len, args.output_len)
    requests_at = [
        random_requests(words, spec, seed=args.seed + index)
        for index in range(len(args.load_factors.split(",")))
    ]
    load_at_start = os.getloadavg()
    # One cluster up at a time, so that the idle one's processes (heartbeats, probes, reports) take nothing
    # from the measured one's two cores: each setup is started for its unloaded measurement, and again for its runs.
    base = {}
    for setup in SETUPS:
        with cluster_of(setup, model) as cluster:
            base[setup] = unloaded(Endpoint(cluster.router_url, model.name), words, args)
    print(f"unloaded, one request at a time: {base}", flush=True)
    slo = Slo(
        ttft_s=args.ttft_slo_factor * max(b["ttft_s"] for b in base.values()),
        tpot_s=args.tpot_slo_factor * max(b["tpot_s"] for b in base.values()),
    )
    capacity = 1.0 / max(b["ttft_s"] for b in base.values())
    rates = [float(f) * capacity for f in args.load_factors.split(",")]
    print(
        f"SLO: TTFT {slo.ttft_s:.3f} s, TPOT {slo.tpot_s:.4f} s; rates {[round(r, 3) for r in rates]} requests/s",
        flush=True,
    )
    rows, results, labels, series = [], [], [], []
    # ABBA order (disaggregated, colocated at the first rate; colocated, disaggregated at the second; ...), a fresh
    # cluster for each run: drift in the machine's other load then falls on both setups alike.
    for index, (rate, requests) in enumerate(zip(rates, requests_at, strict=True)):
        for setup in list(SETUPS) if index % 2 == 0 else list(reversed(SETUPS)):
            with cluster_of(setup, model) as cluster:
                endpoint = Endpoint(cluster.router_url, model.name)
                warmup = random_requests(
                    words, RandomSpec(WARMUP_REQUESTS, args.input_len, args.output_len), seed=args.seed + 2000
                )
                offer(endpoint, warmup, LoadShape(concurrency=1, time_limit_s=args.time_limit))
                load_before, fallbacks = os.getloadavg()[0], counter_total([cluster.router_url], FALLBACKS)
                result = offer(endpoint, requests, LoadShape(rate, None, args.time_limit, args.seed))
                fallbacks = counter_total([cluster.router_url], FALLBACKS) - fallbacks
            rows.append(row(setup, rate, result, slo, load_before, fallbacks))
            results.append(result)
            labels.append(f"{setup} @ {rate:.2f}/s")
            series.append(setup)
            print(f"  {setup} at {rate:.3f}/s: goodput {rows[-1]['goodput_rps']:.3f}/s", flush=True)
    ratios = {}
    for rate in {r["rate_rps"] for r in rows}:
        goodput = {r["setup"]: r["goodput_rps"] for r in rows if r["rate_rps"] == rate}
        ratios[str(rate)] = (
            round(goodput["disaggregated"] / goodput["colocated"], 3) if goodput["colocated"] else None
        )
    print_table(
        rows,
        [
            "setup",
            "rate_rps",
            "goodput_rps",
            "slo_attainment",
            "ttft_p50_s",
            "ttft_p90_s",
            "ttft_p99_s",
            "tpot_p50_s",
            "tpot_p90_s",
            "tpot_p99_s",
            "local_prefill_fallbacks",
            "load_avg_1m",
        ],
    )
    print(f"goodput ratio disaggregated / colocated by rate: {ratios}")
    params = {
        "workload": {
            "model": f"llama {args.size}",
            "input_len": args.input_len,
            "output_len": args.output_len,
            "num_prompts": args.num_prompts,
            "arrivals": "poisson",
        },
        "slo_factors": {"ttft": args.ttft_slo_factor, "tpot": args.tpot_slo_factor},
    }
    summary = {
        "unloaded": base,
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "goodput_ratio_by_rate": ratios,
    }
    load_avg = {"start": list(load_at_start), "end": list(os.getloadavg())}
    result = new_result(
        "disagg_vs_colocated",
        params,
        rows,
        baseline="colocated",
        summary=summary,
        environment={**environment(), "load_avg": load_avg, "cpu_cores": os.cpu_count()},
    )
    print(f"wrote {write_result(result, output_dir(args))}")
    if pyplot_or_none() is not None:
        from kvferry.loadgen.plot import plot_runs

        plot = PLOT if not args.quick else Path(tempfile.gettempdir()) / "disagg_vs_colocated_quick.png"
        plot_runs(plot, results, labels, slo, series)
        print(f"wrote {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
