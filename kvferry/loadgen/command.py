"""`kvferry loadgen`: build a workload, offer it at each requested load, report, write JSON and a plot."""

from __future__ import annotations

import argparse
import asyncio
import math
from pathlib import Path

from kvferry.loadgen.client import ENDPOINT_PATHS, Endpoint
from kvferry.loadgen.datasets import (
    BenchRequest,
    RandomSpec,
    SharedPrefixSpec,
    TokenWords,
    TraceSpec,
    random_requests,
    shared_prefix_requests,
    trace_requests,
    with_token_ids,
)
from kvferry.loadgen.metrics import Slo
from kvferry.loadgen.progress import ProgressBar
from kvferry.loadgen.report import format_summary, run_summary, write_json
from kvferry.loadgen.runner import LoadShape, RunResult, run_load


def _rates(text: str) -> list[float]:
    return [math.inf if part.strip() in ("inf", "") else float(part) for part in text.split(",")]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target")
    target.add_argument("--base-url", default="http://127.0.0.1:8000", help="the router (or any OpenAI server)")
    target.add_argument("--endpoint", choices=sorted(ENDPOINT_PATHS), default="completions",
                        help="node: a decode node's internal generate call (--base-url is the node)")
    target.add_argument("--model", required=True, help="the model folder (its tokenizer sizes the prompts)")
    target.add_argument("--served-model-name", default=None, help="the name sent in requests; default: the folder's name")
    target.add_argument("--api-key", default=None)

    load = parser.add_argument_group("load (every run is bounded by its request count and --time-limit)")
    load.add_argument("--request-rate", type=_rates, default=None,
                      help="Poisson arrivals, requests/s; a comma list sweeps rates (1,2,4); inf: all at once")
    load.add_argument("--concurrency", type=int, default=None, help="at most this many requests in flight")
    load.add_argument("--time-limit", type=float, default=600.0, help="seconds per run; later requests fail")
    load.add_argument("--seed", type=int, default=0)

    data = parser.add_argument_group("dataset")
    data.add_argument("--dataset", choices=("random", "shared-prefix", "trace"), default="random")
    data.add_argument("--num-prompts", type=int, default=100, help="requests of the random dataset; a cap on a trace")
    data.add_argument("--random-input-len", type=int, default=256)
    data.add_argument("--random-output-len", type=int, default=64)
    data.add_argument("--random-range-ratio", type=float, default=0.0, help="lengths uniform in len*(1 -+ ratio)")
    data.add_argument("--shared-prefix-groups", type=int, default=8)
    data.add_argument("--shared-prefix-prompts-per-group", type=int, default=8)
    data.add_argument("--shared-prefix-system-len", type=int, default=512)
    data.add_argument("--shared-prefix-question-len", type=int, default=64)
    data.add_argument("--shared-prefix-output-len", type=int, default=64)
    data.add_argument("--trace", type=Path, default=None, help="Mooncake trace JSONL (timestamp, input_length, ...)")
    data.add_argument("--trace-block-tokens", type=int, default=512, help="prompt tokens per hash id")
    data.add_argument("--trace-speedup", type=float, default=1.0, help="replay the trace this many times faster")

    output = parser.add_argument_group("output")
    output.add_argument("--slo-ttft", type=float, default=None, help="seconds; goodput counts requests within both SLOs")
    output.add_argument("--slo-tpot", type=float, default=None, help="seconds per output token after the first")
    output.add_argument("--out", type=Path, default=None, help="write the summaries and per-request timings as JSON")
    output.add_argument("--plot", type=Path, default=None, help="write latency CDFs (and goodput against rate) as PNG")
    output.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def build_requests(args: argparse.Namespace, words: TokenWords) -> list[BenchRequest]:
    if args.dataset == "random":
        spec = RandomSpec(args.num_prompts, args.random_input_len, args.random_output_len, args.random_range_ratio)
        return random_requests(words, spec, args.seed)
    if args.dataset == "shared-prefix":
        spec = SharedPrefixSpec(args.shared_prefix_groups, args.shared_prefix_prompts_per_group, args.shared_prefix_system_len,
                                args.shared_prefix_question_len, args.shared_prefix_output_len)
        return shared_prefix_requests(words, spec, args.seed)[: args.num_prompts]
    if args.trace is None:
        raise SystemExit("--dataset trace needs --trace FILE.jsonl")
    return trace_requests(words, TraceSpec(args.trace, args.trace_block_tokens, args.trace_speedup, args.num_prompts), args.seed)


def load_shapes(args: argparse.Namespace) -> list[LoadShape]:
    if args.request_rate is None:
        if args.concurrency is None and args.dataset != "trace":
            raise SystemExit("give --request-rate or --concurrency (a trace alone replays its own times)")
        return [LoadShape(None, args.concurrency, args.time_limit, args.seed)]
    return [LoadShape(rate, args.concurrency, args.time_limit, args.seed) for rate in args.request_rate]


def bench(args: argparse.Namespace) -> int:
    from kvferry.engine.tokenizer import ModelTokenizer

    model_dir = Path(args.model)
    endpoint = Endpoint(args.base_url, args.served_model_name or model_dir.name, args.endpoint, args.api_key)
    tokenizer = ModelTokenizer(model_dir)
    requests = build_requests(args, TokenWords(tokenizer))
    if args.endpoint == "node":
        requests = with_token_ids(requests, tokenizer)
    slo = Slo(args.slo_ttft, args.slo_tpot)
    results: list[RunResult] = []
    for shape in load_shapes(args):
        progress = ProgressBar(len(requests), shape.label, enabled=not args.no_progress)
        result = asyncio.run(run_load(endpoint, requests, shape, progress))
        progress.close()
        print(format_summary(run_summary(result, slo), shape.label), flush=True)
        results.append(result)
    if args.out is not None:
        config = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items() if key != "func"}
        write_json(args.out, config, results, slo)
    if args.plot is not None:
        from kvferry.loadgen.plot import plot_runs

        plot_runs(args.plot, results, [r.shape.label for r in results], slo)
    return 0 if all(r.error is None for result in results for r in result.records) else 1
