"""The router's P/D decision (auto) against always- and never-disaggregate, on a mix of short and long prompts.

    1 prefill node on core 0 + 1 decode node on core 1 (one torch thread each), and three routers in front
    of the same two nodes, one per `disaggregation` mode: always (the shipped default: the baseline), never
    (every prompt prefilled on the decode node), and auto (router/scheduling/pd_decision.py).

A routing benchmark on the `tiny` random-weights test checkpoint (its max_position_embeddings raised so that
a 4096-token prompt and its answer fit; random weights make nothing of positions, and the cost of a prefill
is what routing sees). The workload is a seeded mix of 32-token (80%) and 4096-token (20%) prompts with
32-token answers (ignore_eos), Poisson arrivals. Every prompt set is drawn with a seed of its own, so no two
prompts share their first KV block (16 random words) and no request hits a prefix another one cached; the
nodes' prefix-hit counters are recorded per run to show it. At each rate the three modes get the same
sequence of short and long prompts at the same arrival times (fresh texts each).

One pair of nodes serves all three routers, one at a time in ABBA order with a pause between runs: the
modes share the nodes' warm state and the machine's drift (fresh clusters would start six node processes
per rate on two cores). auto starts with disaggregation_min_tokens 512 and is warmed up with P/D requests
until it uses its measured threshold (read from its /stats before and after each run).

SLOs and rates come from measurement, as in disagg_vs_colocated: each mode first serves each prompt class
one request at a time; a class's TTFT SLO is 5x its slowest unloaded TTFT, the TPOT SLO 1.5x the slowest
unloaded TPOT; the rates are fractions of one core's prefill capacity for the mix (1 / the mix's mean
unloaded TTFT). Goodput: requests/s meeting both their SLOs. Which class went which way comes from two
counters per run: the router's kvferry:pd_decisions_total by path, and the prompt tokens the prefill node
looked up (each disaggregated prompt once, with its exact length): two equations in the two unknowns.

    .venv/bin/python -m benchmarks.pd_decision           # -> benchmarks/results/pd_decision.json
    .venv/bin/python -m benchmarks.pd_decision --quick   # 32/512-token prompts, a few requests: a smoke run
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import cached_model, environment, long_context_copy
from benchmarks.harness.plot import save_plot
from benchmarks.harness.results import new_result, params_of, write_result
from benchmarks.harness.side_by_side import side_by_side, with_ratios
from benchmarks.harness.table import print_table
from benchmarks.serving_cluster import NodeSpec, RouterSpec, ServingCluster, counter_total, offer
from kvferry.engine.tokenizer import ModelTokenizer
from kvferry.loadgen.client import Endpoint
from kvferry.loadgen.datasets import BenchRequest, RandomSpec, TokenWords, random_requests
from kvferry.loadgen.metrics import Slo, summarize
from kvferry.loadgen.runner import LoadShape, RunResult
from kvferry.router.scheduling.pd_decision import MIN_SAMPLES

PLOT = Path(__file__).resolve().parent.parent / "docs" / "img" / "pd_decision.png"
VARIANTS = ("always", "never", "auto")  # the ABBA order of the first rate; always is the baseline
CLASSES = ("short", "long")
PREFILL, DECODE = "prefill-0", "decode-0"
# Room for every reservation the decode node may hold while long prompts queue on the prefill node.
NODE_ARGS = ("--num-kv-blocks", "8192")
# A node's health probe answers late while its core prefills a long prompt; an ejected prefill node would
# turn `always` into local prefills.
PROBE_TIMEOUT_SECONDS = 5.0
# disagg_vs_colocated's: a class's TTFT SLO is 5x its unloaded TTFT, the TPOT SLO 1.5x the unloaded TPOT.
TTFT_SLO_FACTOR, TPOT_SLO_FACTOR = 5.0, 1.5
DRAIN_SECONDS = 3.0  # between runs: aborted requests (a run's time limit) leave the nodes
PD_DECISIONS = "kvferry:pd_decisions"
FALLBACKS = "kvferry:local_prefill_fallbacks"
HIT_COUNTER, QUERY_COUNTER = "kvferry:prefix_cache_hits_tokens", "kvferry:prefix_cache_queries_tokens"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, "pd_decision")
    parser.add_argument("--short-len", type=int, default=32)
    parser.add_argument("--long-len", type=int, default=4096)
    parser.add_argument("--long-fraction", type=float, default=0.2, help="share of long prompts in the mix")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=100, help="requests per run")
    parser.add_argument(
        "--min-tokens", type=int, default=512, help="auto's disaggregation_min_tokens (until it has samples)"
    )
    parser.add_argument(
        "--load-factors",
        default="0.4,0.7,0.9",
        help="offered rates, as fractions of the mix's prefill capacity",
    )
    parser.add_argument("--unloaded-requests", type=int, default=3, help="per class and mode, one at a time")
    parser.add_argument("--time-limit", type=float, default=180.0, help="seconds per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="32/512-token prompts, 10 requests, one rate")
    return parser.parse_args(argv)


class Prompts:
    """Fresh prompts at every call, each set drawn with a seed of its own: two prompts sharing their first
    16 random words (a KV block) is as likely as guessing 16 words out of the vocabulary's single-token ones."""

    def __init__(self, words: TokenWords, lengths: dict[str, int], output_len: int, seed: int) -> None:
        self.words, self.lengths, self.output_len = words, lengths, output_len
        self._seeds = itertools.count(seed * 1_000_000)

    def of_length(self, count: int, length: int, range_ratio: float = 0.0) -> list[BenchRequest]:
        spec = RandomSpec(count, length, self.output_len, range_ratio)
        return random_requests(self.words, spec, seed=next(self._seeds))

    def mixed(self, classes: list[str]) -> list[BenchRequest]:
        drawn = {c: iter(self.of_length(classes.count(c), self.lengths[c])) for c in self.lengths}
        return [next(drawn[c]) for c in classes]


def class_order(args: argparse.Namespace, rate_index: int) -> list[str]:
    """The seeded sequence of prompt classes of one rate's runs (the same for every mode)."""
    long_count = round(args.num_prompts * args.long_fraction)
    classes = ["long"] * long_count + ["short"] * (args.num_prompts - long_count)
    random.Random(args.seed + rate_index).shuffle(classes)
    return classes


def pd_stats(router_url: str) -> dict[str, Any]:
    """The router's P/D decision as its /stats shows it: mode, threshold_tokens, samples."""
    return httpx.get(f"{router_url}/stats", timeout=10).json()["disaggregation"]


def counters(cluster: ServingCluster, variant: str) -> dict[str, float]:
    router = [cluster.router_urls[variant]]
    return {
        "kept_on_decode": counter_total(router, PD_DECISIONS, {"path": "kept_on_decode"}),
        "disaggregated": counter_total(router, PD_DECISIONS, {"path": "disaggregated"}),
        "local_prefill_fallbacks": counter_total(router, FALLBACKS),
        "prefill_node_prompt_tokens": counter_total([cluster.node_urls[PREFILL]], QUERY_COUNTER),
        "prefix_hit_tokens": counter_total(list(cluster.node_urls.values()), HIT_COUNTER),
    }


def paths_by_class(
    disaggregated: float, prefill_tokens: float, sent: dict[str, int], lengths: dict[str, int]
) -> dict[str, float]:
    """How many prompts of each class were disaggregated or kept on the decode node: the disaggregated ones
    number `disaggregated` and their lengths add up to `prefill_tokens`. A fraction says a prompt was
    counted on one side only (a failed request)."""
    long_disaggregated = (prefill_tokens - disaggregated * lengths["short"]) / (
        lengths["long"] - lengths["short"]
    )
    split = {"long": long_disaggregated, "short": disaggregated - long_disaggregated}
    return {
        f"{c}_{path}": round(count, 2)
        for c in CLASSES
        for path, count in (("disaggregated", split[c]), ("kept_on_decode", sent[c] - split[c]))
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def row(variant: str, rate: float, result: RunResult, slos: dict[str, Slo], lengths: dict[str, int],
        counted: dict[str, float], thresholds: tuple[int | None, int | None]) -> dict[str, object]:
    """One run's numbers; `counted`: the counters' growth over the run, `thresholds`: auto's before and after."""
    by_class = {c: [r for r in result.records if r.input_tokens == lengths[c]] for c in CLASSES}
    per_class = {c: summarize(records, result.duration_s, slos[c]) for c, records in by_class.items()}
    overall = summarize(result.records, result.duration_s, Slo())
    sent = {c: len(records) for c, records in by_class.items()}
    return {
        "variant": variant,
        "rate_rps": round(rate, 3),
        "goodput_rps": _rounded(sum(s["goodput_rps"] for s in per_class.values())),
        **{f"{c}_slo_attainment": round(s["slo_attainment"], 3) for c, s in per_class.items()},
        **{f"ttft_{c}_{p}_s": _rounded(s["ttft_s"][p]) for c, s in per_class.items() for p in ("p50", "p90")},
        **{f"tpot_{p}_s": _rounded(overall["tpot_s"][p]) for p in ("p50", "p90")},
        "completed": overall["completed"],
        "failed": overall["failed"],
        **paths_by_class(counted["disaggregated"], counted["prefill_node_prompt_tokens"], sent, lengths),
        "kept_on_decode": int(counted["kept_on_decode"]),
        "disaggregated": int(counted["disaggregated"]),
        "threshold_tokens": list(thresholds),
        "local_prefill_fallbacks": int(counted["local_prefill_fallbacks"]),
        "prefix_hit_tokens": int(counted["prefix_hit_tokens"]),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "errors": overall["errors"],
    }


def router_specs(folder: Path, min_tokens: int) -> list[RouterSpec]:
    """A router per mode, each with its --router-config file written under `folder`."""
    specs = []
    for variant in VARIANTS:
        path = folder / f"{variant}.json"
        settings = {
            "disaggregation": variant,
            "disaggregation_min_tokens": min_tokens,
            "probe_timeout_seconds": PROBE_TIMEOUT_SECONDS,
        }
        path.write_text(json.dumps(settings))
        specs.append(RouterSpec(variant, ("--router-config", str(path))))
    return specs


def warm_up(endpoints: dict[str, Endpoint], prompts: Prompts, args: argparse.Namespace) -> dict[str, Any]:
    """A short and a long prompt through each router (a node's first prefills on each path are slow), then
    P/D requests through auto, of lengths from its min_tokens to the long length, until it has the samples
    its measured threshold needs. auto's /stats after."""
    one_at_a_time = LoadShape(concurrency=1, time_limit_s=args.time_limit)
    for endpoint in endpoints.values():
        offer(endpoint, prompts.mixed(list(CLASSES)), one_at_a_time)
    low, high = args.min_tokens, args.long_len
    spread = prompts.of_length(MIN_SAMPLES, (low + high) // 2, (high - low) / (high + low))
    offer(endpoints["auto"], spread, one_at_a_time)
    stats = pd_stats(endpoints["auto"].base_url)
    if stats["samples"] < MIN_SAMPLES:
        raise RuntimeError(f"auto has {stats['samples']} P/D samples after its warm-up, needs {MIN_SAMPLES}")
    return stats


def unloaded(endpoint: Endpoint, prompts: Prompts, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Per class: the TTFT and TPOT medians of requests served one at a time."""
    medians = {}
    for c in CLASSES:
        requests = prompts.of_length(args.unloaded_requests, prompts.lengths[c])
        result = offer(endpoint, requests, LoadShape(concurrency=1, time_limit_s=args.time_limit))
        summary = summarize(result.records, result.duration_s, Slo())
        medians[c] = {"ttft_s": summary["ttft_s"]["p50"], "tpot_s": summary["tpot_s"]["p50"]}
    return medians


def measure(
    cluster: ServingCluster,
    variant: str,
    requests: list[BenchRequest],
    shape: LoadShape,
    slos: dict[str, Slo],
    lengths: dict[str, int],
) -> dict[str, object]:
    url = cluster.router_urls[variant]
    before, threshold_before = counters(cluster, variant), pd_stats(url)["threshold_tokens"]
    result = offer(Endpoint(url, cluster.model.name), requests, shape)
    after, threshold_after = counters(cluster, variant), pd_stats(url)["threshold_tokens"]
    time.sleep(DRAIN_SECONDS)
    counted = {key: after[key] - before[key] for key in after}
    assert shape.request_rate is not None
    measured = row(
        variant, shape.request_rate, result, slos, lengths, counted, (threshold_before, threshold_after)
    )
    print(
        f"  {variant} at {shape.request_rate:.3f}/s: goodput {measured['goodput_rps']}/s; short prompts kept on "
        f"decode {measured['short_kept_on_decode']}, disaggregated {measured['short_disaggregated']}; long "
        f"kept {measured['long_kept_on_decode']}, disaggregated {measured['long_disaggregated']}",
        flush=True,
    )
    return measured


def routed_as_intended(measured: dict[str, Any]) -> bool:
    """Every short prompt kept on the decode node and every long one sent through P -> D."""
    return measured["short_disaggregated"] == 0 and measured["long_kept_on_decode"] == 0


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Goodput against the offered rate, a line per mode."""

    def draw(pyplot: Any) -> Any:
        figure, axis = pyplot.subplots(figsize=(6, 4))
        for variant in VARIANTS:
            points = [(r["rate_rps"], r["goodput_rps"]) for r in rows if r["variant"] == variant]
            axis.plot(*zip(*points, strict=True), "o-", label=variant)
        axis.set(xlabel="offered requests/s", ylabel="goodput at SLO, requests/s", title="P/D decision")
        axis.grid(True, alpha=0.3)
        axis.legend()
        return figure

    save_plot(path, draw)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.long_len, args.min_tokens, args.num_prompts = 512, 128, 10
        args.load_factors, args.unloaded_requests, args.time_limit = "0.5", 1, 60.0
    lengths = {"short": args.short_len, "long": args.long_len}
    max_model_len = args.long_len + 512  # a long prompt and its answer
    model, model_note = long_context_copy(cached_model("llama", "tiny"), max_model_len)
    prompts = Prompts(TokenWords(ModelTokenizer(model)), lengths, args.output_len, args.seed)
    node_args = (*NODE_ARGS, "--max-model-len", str(max_model_len))
    nodes = [
        NodeSpec("prefill", PREFILL, core=0, args=node_args),
        NodeSpec("decode", DECODE, core=1, args=node_args),
    ]
    load_at_start = os.getloadavg()
    with (
        tempfile.TemporaryDirectory() as folder,
        ServingCluster(model, nodes, router_specs(Path(folder), args.min_tokens)) as cluster,
    ):
        endpoints = {v: Endpoint(cluster.router_urls[v], model.name) for v in VARIANTS}
        warmed = warm_up(endpoints, prompts, args)
        print(f"auto after its warm-up: {warmed}", flush=True)
        base = {v: unloaded(endpoints[v], prompts, args) for v in VARIANTS}
        print(f"unloaded, one request at a time: {base}", flush=True)
        tpot_slo = TPOT_SLO_FACTOR * max(b[c]["tpot_s"] for b in base.values() for c in CLASSES)
        slos = {
            c: Slo(TTFT_SLO_FACTOR * max(b[c]["ttft_s"] for b in base.values()), tpot_slo) for c in CLASSES
        }
        share = {"long": args.long_fraction, "short": 1 - args.long_fraction}
        capacity = 1 / max(sum(share[c] * b[c]["ttft_s"] for c in CLASSES) for b in base.values())
        rates = [float(f) * capacity for f in args.load_factors.split(",")]
        print(f"SLOs {slos}; rates {[round(r, 3) for r in rates]} requests/s", flush=True)

        def runs_of(variant: str) -> Callable[[], dict[str, object]]:
            plan = iter(enumerate(rates))

            def run() -> dict[str, object]:
                index, rate = next(plan)
                # Every mode: the same classes in the same order at the same arrival times.
                shape = LoadShape(rate, None, args.time_limit, args.seed + index)
                return measure(
                    cluster, variant, prompts.mixed(class_order(args, index)), shape, slos, lengths
                )

            return run

        measured = side_by_side({v: runs_of(v) for v in VARIANTS}, rounds=len(rates))
    runs = sorted((r for by_rate in measured.values() for r in by_rate), key=lambda r: r["rate_rps"])
    rows = with_ratios(runs, "always", ["goodput_rps"], ["rate_rps"])
    print_table(
        rows,
        [
            "variant",
            "rate_rps",
            "goodput_rps",
            "goodput_rps_vs_baseline",
            "short_slo_attainment",
            "long_slo_attainment",
            "ttft_short_p50_s",
            "ttft_short_p90_s",
            "ttft_long_p50_s",
            "ttft_long_p90_s",
            "tpot_p50_s",
            "tpot_p90_s",
            "short_kept_on_decode",
            "short_disaggregated",
            "long_kept_on_decode",
            "long_disaggregated",
            "threshold_tokens",
            "failed",
        ],
    )
    auto_as_intended = {str(r["rate_rps"]): routed_as_intended(r) for r in measured["auto"]}
    print(
        f"auto kept every short prompt on decode and sent every long one through P -> D, by rate: {auto_as_intended}"
    )
    summary = {
        "auto_after_warmup": warmed,
        "auto_routed_as_intended": auto_as_intended,
        "unloaded": base,
        "slo": {c: {"ttft_s": s.ttft_s, "tpot_s": s.tpot_s} for c, s in slos.items()},
        "mix_prefill_capacity_rps": capacity,
    }
    notes = [
        "A routing benchmark on the tiny random-weights test checkpoint: the numbers say how the routes compare "
        "on this machine's two cores, not how a real model would serve.",
        "Which class went which way per run: from the router's pd_decisions counter and the prompt tokens the "
        "prefill node looked up (short_/long_ disaggregated and kept_on_decode).",
        "threshold_tokens: auto's threshold from its /stats before and after the run (None: never, or a fixed mode).",
        *([model_note] if model_note else []),
    ]
    result = new_result(
        "pd_decision",
        {
            **params_of(args),
            "model": "llama tiny (random weights)",
            "max_model_len": max_model_len,
            "slo_factors": {"ttft": TTFT_SLO_FACTOR, "tpot": TPOT_SLO_FACTOR},
        },
        rows,
        baseline="always",
        summary=summary,
        notes=notes,
        environment={
            **environment(),
            "load_avg": {"start": list(load_at_start), "end": list(os.getloadavg())},
            "cpu_cores": os.cpu_count(),
        },
    )
    print(f"wrote {write_result(result, output_dir(args))}")
    plot(rows, PLOT if not args.quick else Path(tempfile.gettempdir()) / "pd_decision_quick.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
