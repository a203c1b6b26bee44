"""Mid-stream migration: how long a decode node's death interrupts the streams it was decoding.

    1 prefill node + 2 decode nodes + the router (router/dispatch/migration.py), the `tiny` test checkpoint.

Each fault: STREAMS greedy streams of MAX_TOKENS tokens go through the router; once every one has its first
chunks, the decode node decoding more of them is SIGKILLed; every stream
must still complete with all its tokens. The victim then restarts on its port and the router is waited on
until it routes to it again, so every fault starts from two healthy decode nodes.

Per fault, from the client's side (chunk arrival times): the streams that migrated are the ones the router
counted (kvferry:router_migrations_total{outcome="migrated"}), the ones with the longest gap across the kill.
- time to recover: the kill -> the first chunk after it of any migrated stream (the first successful token);
- migration gap: for each migrated stream, its longest gap between two chunks around the kill;
- the baseline: the gaps between consecutive chunks of the streams that did not migrate, around the kill.
p50 / p99 over the faults; a failed or short stream is counted and reported, never dropped.

    .venv/bin/python -m benchmarks.migration            # 50 faults -> benchmarks/results/migration.json
    .venv/bin/python -m benchmarks.migration --quick    # 3 faults: a smoke run
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import cached_model
from benchmarks.harness.plot import save_plot
from benchmarks.harness.processes import wait_until
from benchmarks.harness.results import new_result, params_of, write_result
from benchmarks.harness.table import print_table
from benchmarks.serving_cluster import NodeSpec, ServingCluster, counter_total

PLOT = Path(__file__).resolve().parent.parent / "docs" / "img" / "migration.png"
DECODES = ("decode-0", "decode-1")
MIGRATED = {"outcome": "migrated"}
FAULT_WAIT_SECONDS = 60.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, "migration")
    parser.add_argument("--faults", type=int, default=50)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="3 faults")
    args = parser.parse_args(argv)
    if args.quick:
        args.faults = 3
    return args


@dataclass
class Stream:
    """One streamed completion as its client saw it: when each chunk came, and how it ended."""

    chunk_times: list[float] = field(default_factory=list)
    tokens: int | None = None  # the usage chunk's completion_tokens
    error: str | None = None


def read_stream(router: str, model: str, index: int, max_tokens: int, stream: Stream) -> None:
    body = {"model": model, "prompt": [(7 * index + k) % 900 + 5 for k in range(24 + index)], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    try:
        with httpx.stream("POST", f"{router}/v1/completions", json=body, timeout=120) as response:
            if response.status_code != 200:
                stream.error = f"{response.status_code} {response.read()[:200]!r}"
                return
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line.removeprefix("data: "))
                if "error" in event:
                    stream.error = event["error"]["message"]
                elif event.get("usage"):
                    stream.tokens = event["usage"]["completion_tokens"]
                if event.get("choices"):
                    stream.chunk_times.append(time.monotonic())
    except httpx.HTTPError as exc:
        stream.error = repr(exc)


def gap_across(stream: Stream, instant: float) -> tuple[float, float] | None:
    """The longest gap between two chunks of a stream that ends after `instant` and starts between a second
    before it and half a second after it, as (its start, its end); None when there is none. Not simply the
    gap across `instant`: chunks the router had read from the killed node before the kill still reach the
    client after it. Nor any later gap: streams that migrated in less than 190 ms, and later had one gap
    a little longer, 5-6 s after the kill, once had that later gap counted as their recovery (the two
    outliers of the first 50 faults)."""
    times = stream.chunk_times
    gaps = [(a, b) for a, b in zip(times, times[1:], strict=False) if b > instant and instant - 1.0 <= a <= instant + 0.5]
    return max(gaps, key=lambda gap: gap[1] - gap[0], default=None)


def one_fault(cluster: ServingCluster, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """The victim: whichever decode node runs more of the streams once they are all under way (the router may
    put them all on one)."""
    router = cluster.router_url
    migrated_before = counter_total([router], "kvferry:router_migrations", MIGRATED)
    streams = [Stream() for _ in range(args.streams)]
    with ThreadPoolExecutor(args.streams) as pool:
        running = [pool.submit(read_stream, router, model, i, args.max_tokens, s) for i, s in enumerate(streams)]

        def ready_to_kill() -> bool:
            return all(len(s.chunk_times) >= 2 for s in streams) or any(f.done() for f in running)

        if not wait_until(ready_to_kill, FAULT_WAIT_SECONDS, interval_s=0.02):
            raise RuntimeError("the streams never got under way")
        decoding = {name: httpx.get(f"{cluster.node_urls[name]}/stats", timeout=5).json()["running"] for name in DECODES}
        victim = max(decoding, key=decoding.__getitem__)
        killed = time.monotonic()
        cluster.kill(victim)
        for future in running:
            future.result()
    migrated = int(counter_total([router], "kvferry:router_migrations", MIGRATED) - migrated_before)
    gaps = sorted(((g[1] - g[0], g[1]) for s in streams if (g := gap_across(s, killed))), reverse=True)
    moved, stayed = gaps[:migrated], gaps[migrated:]
    cluster.restart(victim)
    wait_until(lambda: _routes_to(router, cluster.node_urls[victim]), FAULT_WAIT_SECONDS, interval_s=0.2)
    return {
        "victim": victim,
        "migrated": migrated,
        "failed": sum(s.error is not None or s.tokens != args.max_tokens for s in streams),
        "errors": sorted({s.error for s in streams if s.error})[:3],
        "recover_ms": 1e3 * (min(first for _, first in moved) - killed) if moved else None,
        "migration_gaps_ms": [1e3 * gap for gap, _ in moved],
        "baseline_gaps_ms": [1e3 * gap for gap, _ in stayed],
    }


def _routes_to(router: str, url: str) -> bool:
    nodes = httpx.get(f"{router}/stats", timeout=5).json()["nodes"]
    return any(node["url"] == url and node["healthy"] for node in nodes)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summarize(faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    series = {
        "time to recover (kill -> first token)": [f["recover_ms"] for f in faults if f["recover_ms"] is not None],
        "migration gap (last token -> next)": [g for f in faults for g in f["migration_gaps_ms"]],
        "gap of streams not migrated, across the kill": [g for f in faults for g in f["baseline_gaps_ms"]],
    }
    return [{"measure": name, "samples": len(values), "p50_ms": percentile(values, 50), "p99_ms": percentile(values, 99),
             "max_ms": max(values) if values else None} for name, values in series.items()]


def draw(faults: list[dict[str, Any]]) -> Any:
    def plot(pyplot: Any) -> Any:
        figure, axis = pyplot.subplots(figsize=(7, 4))
        for label, values in (("migration gap", [g for f in faults for g in f["migration_gaps_ms"]]),
                              ("time to recover", [f["recover_ms"] for f in faults if f["recover_ms"] is not None]),
                              ("gap, not migrated", [g for f in faults for g in f["baseline_gaps_ms"]])):
            ordered = sorted(values)
            axis.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=label)
        axis.set_xscale("log")
        axis.set_xlabel("ms")
        axis.set_ylabel("fraction of samples")
        axis.set_title(f"A decode node SIGKILLed mid-stream ({len(faults)} faults)")
        axis.legend()
        figure.tight_layout()
        return figure

    return plot


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model = cached_model("llama", "tiny", seed=1)
    nodes = [NodeSpec("prefill", "prefill-0"), *(NodeSpec("decode", name) for name in DECODES)]
    faults = []
    with ServingCluster(model, nodes, node_args=("--num-kv-blocks", "2048")) as cluster:
        for index in range(args.faults):
            fault = one_fault(cluster, model.name, args)
            faults.append(fault)
            print(f"fault {index + 1}/{args.faults}: {fault['victim']} killed, {fault['migrated']} migrated, "
                  f"{fault['failed']} failed, recovered in {fault['recover_ms']} ms", flush=True)
    rows = summarize(faults)
    print_table(rows, ["measure", "samples", "p50_ms", "p99_ms", "max_ms"])
    failed = sum(f["failed"] for f in faults)
    summary = {"faults": len(faults), "streams": len(faults) * args.streams, "migrated": sum(f["migrated"] for f in faults),
               "failed_streams": failed, "per_fault": faults}
    notes = [f"{failed} of {summary['streams']} streams failed or came short"] if failed else []
    result = new_result("migration", params_of(args), rows, summary=summary, notes=notes)
    path = write_result(result, output_dir(args))
    print(f"wrote {path}")
    if not args.quick:
        save_plot(PLOT, draw(faults))


if __name__ == "__main__":
    main()
