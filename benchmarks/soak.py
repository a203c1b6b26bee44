"""Soak (reliability scenario 14): memory, descriptors and tasks of every process under ten minutes of load.

Fixed concurrency through a local cluster for ten minutes, and the resident memory, open file descriptors
and asyncio tasks of the router, the prefill node and the decode node sampled every 30 s. Pass: every metric of every process grows less than 5% from the mean of the first three samples
after the one-minute warm-up to the mean of the last three, and no request fails.

The cluster: the tiny random-weight llama (`kvferry make-model`), one prefill node, one decode node and a
router over them, with a real redis-server holding the node registry and the prefix index. The load: a closed
loop of `--concurrency` streams cycling through prompts of mixed lengths (so prompts come back and hit or
evict cached prefixes), six in ten streamed, three in ten not streamed, one in ten streamed and left after a
few chunks (a client disconnect: the router must abort it on both nodes; counted apart, not as a failure);
completions and chat alternate. A request fails on any error or on fewer tokens than asked (ignore_eos).

Each sample holds new requests until the ones in flight finish (bounded), lets the idle keep-alive
connections between router and nodes close (SETTLE_S), then reads each process a few times half a second
apart and keeps each metric's smallest reading: counts are taken between requests, so what the in-flight
requests, the connection pool or a health probe hold at that instant does not pass for growth, and what a
leak leaves behind does. The load pauses for that (about 8 s of every 30 s; the JSON says how long).

    .venv/bin/python -m benchmarks.soak           # 10 min -> benchmarks/results/soak.json, docs/img/soak.png
    .venv/bin/python -m benchmarks.soak --quick   # 60 s smoke run, result and plot in a temp folder
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import cached_model, environment
from benchmarks.harness.plot import save_plot
from benchmarks.harness.results import new_result, write_result
from benchmarks.serving_cluster import NodeSpec, RouterSpec, ServingCluster, wait_until_ready
from benchmarks.soak_load import ENDPOINT_KINDS, LEAVE_AFTER_CHUNKS, MODE_CYCLE, Load
from benchmarks.soak_sampling import (
    METRICS,
    TASKS_GAUGE,
    ProcessReading,
    gauge_value,
    growth,
    proc_usage,
    quietest,
)
from kvferry.internal_api import CALLER_KEEPALIVE_SECONDS
from kvferry.loadgen.client import client_session
from kvferry.loadgen.datasets import BenchRequest, RandomSpec, TokenWords, random_requests

PLOT = Path(__file__).resolve().parent.parent / "docs" / "img" / "soak.png"
READINGS_PER_SAMPLE, READING_GAP_S = 3, 0.5
# The router's pools keep a connection to a node per call it once had in flight at a time, and drop one idle for
# CALLER_KEEPALIVE_SECONDS: the control calls' pool on its next health probe (every second), the streams' pool on
# its cleanup, which runs once per keep-alive (so up to twice that). Read before that, descriptors swung 25-44
# with how busy the machine was; read after it, the count is the idle one.
SETTLE_S = 2 * CALLER_KEEPALIVE_SECONDS + 0.5
DRAIN_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 60.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, "soak")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before the baseline sample")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=256, help="distinct prompts, cycled through")
    parser.add_argument("--input-len", type=int, default=192, help="mean prompt tokens (spread +-90%%)")
    parser.add_argument("--output-len", type=int, default=32, help="mean output tokens (spread +-90%%)")
    parser.add_argument("--max-growth-pct", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="60 s, a sample every 10 s, 20 s warm-up")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.interval, args.warmup = 60.0, 10.0, 20.0
    return args


async def read_process(client: httpx.AsyncClient, pid: int, url: str) -> ProcessReading:
    rss_mib, fds, threads = proc_usage(pid)
    response = await client.get(f"{url}/metrics")
    response.raise_for_status()
    return ProcessReading(rss_mib, fds, threads, int(gauge_value(response.text, TASKS_GAUGE)))


async def sample(
    client: httpx.AsyncClient, cluster: ServingCluster, load: Load, t_s: float
) -> dict[str, object]:
    urls = {**cluster.node_urls, **cluster.router_urls}
    began = time.monotonic()
    async with load.gate.closed(DRAIN_TIMEOUT_S) as drained:
        drain_s = time.monotonic() - began
        await asyncio.sleep(SETTLE_S)
        readings: dict[str, list[ProcessReading]] = {name: [] for name in urls}
        for attempt in range(READINGS_PER_SAMPLE):
            if attempt:
                await asyncio.sleep(READING_GAP_S)
            for name, process in cluster.local.processes:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {process.returncode}; see {cluster.local.workdir}"
                    )
                readings[name].append(await read_process(client, process.pid, urls[name]))
    return {
        "t_s": round(t_s, 1),
        "drained": drained,
        "drain_s": round(drain_s, 2),
        "load_avg_1m": os.getloadavg()[0],
        "requests_sent": load.sent,
        "failed": load.failed,
        "processes": {name: asdict(quietest(values)) for name, values in readings.items()},
    }


def progress(entry: dict[str, object]) -> str:
    processes = "  ".join(
        f"{name} {p['rss_mib']:.1f} MiB {p['open_fds']} fds {p['asyncio_tasks']} tasks"
        for name, p in entry["processes"].items()  # type: ignore[union-attr]
    )
    return (
        f"[{entry['t_s']:6.1f} s] sent {entry['requests_sent']} failed {entry['failed']} "
        f"(drain {entry['drain_s']} s, load {entry['load_avg_1m']:.2f})  {processes}"
    )


async def soak(
    cluster: ServingCluster, model: str, requests: list[BenchRequest], args: argparse.Namespace
) -> tuple[Load, list[dict]]:
    start = time.monotonic()
    load = Load(cluster.router_url, model, requests, end=start + args.duration)
    # A connection per request, as from many clients: the router must close every socket it accepted (a
    # descriptor leak shows at once), and between requests it holds none of ours, so its count is steady.
    async with (
        client_session(args.concurrency, REQUEST_TIMEOUT_S, keep_alive=False) as client,
        httpx.AsyncClient(timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0)) as scraper,
    ):
        samples = [await sample(scraper, cluster, load, 0.0)]
        print(progress(samples[-1]), flush=True)
        # A request takes well over 10 ms, so this bounds a worker's loop by count as well as by the end time.
        max_requests = int(args.duration * 100)
        workers = [asyncio.create_task(load.worker(client, max_requests)) for _ in range(args.concurrency)]
        for index in range(1, int(args.duration // args.interval) + 1):
            await asyncio.sleep(max(0.0, start + index * args.interval - time.monotonic()))
            samples.append(await sample(scraper, cluster, load, time.monotonic() - start))
            print(progress(samples[-1]), flush=True)
        await asyncio.wait_for(asyncio.gather(*workers), REQUEST_TIMEOUT_S + DRAIN_TIMEOUT_S)
    return load, samples


def summarize(samples: list[dict], load: Load, args: argparse.Namespace) -> dict[str, object]:
    times = [entry["t_s"] for entry in samples]
    growths = {
        name: {
            metric: growth(times, [entry["processes"][name][metric] for entry in samples], args.warmup)
            for metric in METRICS
        }
        for name in samples[0]["processes"]
    }
    flat = all(
        g["growth_pct"] < args.max_growth_pct for metrics in growths.values() for g in metrics.values()
    )
    per_sample = SETTLE_S + (READINGS_PER_SAMPLE - 1) * READING_GAP_S
    paused = sum(entry["drain_s"] + per_sample for entry in samples[1:])
    return {
        "passed": flat and load.failed == 0,
        "flat": flat,
        "max_growth_pct": args.max_growth_pct,
        "growth": growths,
        "requests_sent": load.sent,
        "failed": load.failed,
        "left_mid_stream": load.outcomes["leave left"],
        "outcomes": dict(sorted(load.outcomes.items())),
        "errors": dict(load.errors.most_common(10)),
        "paused_for_samples_s": round(paused, 1),
        "every_sample_drained": all(entry["drained"] for entry in samples),
    }


def plot(path: Path, samples: list[dict], summary: dict, args: argparse.Namespace) -> None:
    save_plot(path, lambda pyplot: draw(pyplot, samples, summary, args))


def draw(pyplot: Any, samples: list[dict], summary: dict, args: argparse.Namespace) -> Any:
    figure, panels = pyplot.subplots(1, len(METRICS), figsize=(6 * len(METRICS), 4))
    minutes = [entry["t_s"] / 60 for entry in samples]
    titles = {
        "rss_mib": "resident memory (MiB)",
        "open_fds": "open file descriptors",
        "asyncio_tasks": "asyncio tasks",
    }
    for axes, metric in zip(panels, METRICS, strict=True):
        for name in samples[0]["processes"]:
            pct = summary["growth"][name][metric]["growth_pct"]
            axes.plot(
                minutes,
                [entry["processes"][name][metric] for entry in samples],
                marker="o",
                markersize=3,
                label=f"{name} ({pct:+.1f}%)",
            )
        axes.axvspan(0, args.warmup / 60, color="grey", alpha=0.15, label="warm-up")
        axes.set(title=titles[metric], xlabel="minutes", ylim=(0, None))
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    verdict = "flat" if summary["flat"] else "GREW"
    figure.suptitle(
        f"soak: {args.concurrency} streams, {summary['requests_sent']} requests, {summary['failed']} failed, "
        f"{summary['left_mid_stream']} left mid-stream; growth after warm-up (in legends): {verdict}"
    )
    figure.tight_layout()
    return figure


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from kvferry.engine.tokenizer import ModelTokenizer

    model = cached_model("llama", "tiny")
    spec = RandomSpec(args.prompts, args.input_len, args.output_len, range_ratio=0.9)
    requests = random_requests(TokenWords(ModelTokenizer(model)), spec, seed=14)
    load_at_start = os.getloadavg()
    nodes = [NodeSpec("prefill", "prefill-0"), NodeSpec("decode", "decode-0")]
    with ServingCluster(model, nodes, [RouterSpec(with_index=True)]) as cluster:
        wait_until_ready(cluster.router_url)
        load, samples = asyncio.run(soak(cluster, model.name, requests, args))
    summary = summarize(samples, load, args)
    print(
        json.dumps(
            {key: summary[key] for key in ("passed", "requests_sent", "failed", "left_mid_stream", "errors")}
        )
    )
    for name, metrics in summary["growth"].items():
        print(
            f"  {name}: "
            + ", ".join(
                f"{metric} {g['baseline']} -> {g['final']} ({g['growth_pct']:+}%)"
                for metric, g in metrics.items()
            )
        )
    workload = {
        "model": "llama tiny",
        "nodes": "1 prefill + 1 decode, router with the Redis prefix index",
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "interval_s": args.interval,
        "warmup_s": args.warmup,
        "prompts": args.prompts,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "spread": 0.9,
        "modes": list(MODE_CYCLE),
        "endpoint_kinds": list(ENDPOINT_KINDS),
        "leave_after_chunks": LEAVE_AFTER_CHUNKS,
        "readings_per_sample": READINGS_PER_SAMPLE,
        "settle_s": SETTLE_S,
    }
    load_avg = {"start": list(load_at_start), "end": list(os.getloadavg())}
    # A row per sample: the processes' readings over the run, which the summary's growth is judged from.
    result = new_result(
        "soak",
        {"workload": workload},
        samples,
        summary=summary,
        environment={**environment(), "load_avg": load_avg, "cpu_cores": os.cpu_count()},
    )
    folder = output_dir(args)
    print(f"wrote {write_result(result, folder)}")
    plot(folder / "soak.png" if args.quick else PLOT, samples, summary, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
