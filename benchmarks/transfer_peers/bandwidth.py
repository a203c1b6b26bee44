"""The bandwidth part: the memcpy, then each system in its own pair of processes, over every block size and
round; a row per block size with every system's GB/s and latencies, and issue 9's targets."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.warmup import timed_runs
from benchmarks.transfer_peers.machine import loadavg, ucx_transports
from benchmarks.transfer_peers.measurement import Measurement, pooled
from benchmarks.transfer_peers.pair import SYSTEM_ENV, Pair, PeerError, Registry
from benchmarks.transfer_peers.workload import (
    Batch,
    KiB,
    batch_for,
    digest,
    expected_image,
    size_label,
    source_bytes,
)

ENGINES = ("kvferry", "nixl", "mooncake_tcp")
INSTALL_HINT = {
    "nixl": ".venv/bin/uv pip install --python .venv/bin/python -e '.[bench]'   (brings nixl-cu12)",
    "mooncake_tcp": "apt-get update && apt-get install -y libibverbs1; "
    ".venv/bin/uv pip install --python .venv/bin/python -e '.[bench]'   (brings mooncake-transfer-engine-non-cuda)",
}


def measure_memcpy(
    source: np.ndarray, batch: Batch, runs: int, warmup: int, expected: str
) -> tuple[Measurement, Measurement]:
    """In one process, one thread: the same blocks to the same slots (numpy's fancy assignment copies
    each row with memcpy), and one contiguous copy of the whole batch."""
    src = source[: batch.nbytes].reshape(batch.count, batch.block_bytes)
    dst = np.zeros_like(src)
    slots = batch.slots()

    def scatter() -> None:
        dst[slots] = src

    scattered = timed_runs(scatter, runs, warmup)
    ok = digest(dst.reshape(-1), batch.nbytes) == expected
    contiguous = timed_runs(lambda: np.copyto(dst, src), runs, warmup)
    return Measurement.of(batch.nbytes, scattered, ok), Measurement.of(batch.nbytes, contiguous, True)


def measure_engine(system: str, batches: list[Batch], expected: dict[Batch, str], args: argparse.Namespace,
                   registry: str, logs: Path) -> dict[str, Any]:  # fmt: skip
    """One system over every batch, in one pair of processes; {'error': reason} if it cannot run."""
    load_before = loadavg()
    try:
        pair = Pair.start(system, max(b.nbytes for b in batches), registry, logs)
    except PeerError as exc:
        return {"error": str(exc), "install": INSTALL_HINT.get(system)}
    results: dict[str, Any] = {
        "load_before": load_before,
        "env": SYSTEM_ENV.get(system, {}),
        "measurements": {},
    }
    try:
        results["ucx_versions"] = pair.initiator.call("versions")["ucx"]
        for batch in batches:
            m = pair.measure(batch, args.runs, args.warmup, expected[batch])
            results["measurements"][batch] = m
            print(f"  {system:13s} {size_label(batch.block_bytes):>7s} x {batch.count:5d}{' contiguous' if batch.seed is None else ''}: "
                  f"{m.gbps:7.3f} GB/s  p50 {m.p50_ms:8.2f} ms  p99 {m.p99_ms:8.2f} ms", flush=True)  # fmt: skip
    except PeerError as exc:
        results["error"] = str(exc)
    finally:
        pair.stop()
    results["transports"] = {
        role: ucx_transports(logs / f"{system}-{role}.log") for role in ("initiator", "target")
    }
    results["load_after"] = loadavg()
    return results


def bandwidth_part(args: argparse.Namespace, registry: Registry, logs: Path) -> dict[str, Any]:
    scattered = [batch_for(size, args.batch_bytes) for size in args.block_sizes]
    contiguous = [batch_for(size, args.batch_bytes, contiguous=True) for size in args.block_sizes]
    source = source_bytes(args.batch_bytes)
    expected = {b: digest(expected_image(source, b), b.nbytes) for b in scattered + contiguous}
    rounds = []
    for number in range(args.rounds):
        if args.rounds > 1:
            print(f"round {number + 1} of {args.rounds}", flush=True)
        # Odd rounds reverse the order, so that no system always runs first after the memcpy.
        order = args.systems if number % 2 == 0 else args.systems[::-1]
        rounds.append(bandwidth_round(order, scattered, contiguous, source, expected, args, registry, logs))
    memcpy = {b.block_bytes: (pooled(b.nbytes, [r[0][b.block_bytes][0] for r in rounds]), pooled(b.nbytes, [r[0][b.block_bytes][1] for r in rounds]))
              for b in scattered}  # fmt: skip
    systems = {name: merge_rounds([r[1][name] for r in rounds]) for name in args.systems}
    rows = [
        bandwidth_row(s, c, memcpy[s.block_bytes], systems)
        for s, c in zip(scattered, contiguous, strict=True)
    ]
    if args.rounds > 1:
        for row, batch in zip(rows, scattered, strict=True):
            row["rounds"] = round_columns(batch, rounds)
    return {"rows": rows, "systems": {name: _system_summary(r) for name, r in systems.items()}}


Round = tuple[dict[int, tuple[Measurement, Measurement]], dict[str, dict[str, Any]]]


def bandwidth_round(order: list[str], scattered: list[Batch], contiguous: list[Batch], source: np.ndarray, expected: dict[Batch, str],
                    args: argparse.Namespace, registry: Registry, logs: Path) -> Round:  # fmt: skip
    """The memcpy, then each system in `order` in its own pair of processes (started and stopped here)."""
    memcpy: dict[int, tuple[Measurement, Measurement]] = {}
    for batch in scattered:
        memcpy[batch.block_bytes] = measure_memcpy(source, batch, args.runs, args.warmup, expected[batch])
        print(
            f"  memcpy        {size_label(batch.block_bytes):>7s}: {memcpy[batch.block_bytes][0].gbps:7.3f} GB/s",
            flush=True,
        )
    systems: dict[str, dict[str, Any]] = {}
    for system in order:
        batches = scattered + contiguous if system == "kvferry" else scattered
        systems[system] = measure_engine(system, batches, expected, args, registry.url, logs)
        if "error" in systems[system]:
            print(f"  {system}: no numbers: {systems[system]['error']}", flush=True)
    return memcpy, systems


def merge_rounds(results: list[dict[str, Any]]) -> dict[str, Any]:
    """A system's results over the rounds: measurements pooled per batch, the first error kept, the
    load before the first round and after the last."""
    merged = {**results[-1], "load_before": results[0].get("load_before")}
    batches = {batch for r in results for batch in r.get("measurements", {})}
    merged["measurements"] = {
        b: pooled(b.nbytes, [r["measurements"][b] for r in results if b in r.get("measurements", {})])
        for b in batches
    }
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        merged["error"] = errors[0]
    return merged


def round_columns(batch: Batch, rounds: list[Round]) -> dict[str, list[float | None]]:
    """Per round, each system's GB/s and kvferry's ratios to NIXL and to memcpy measured in that round:
    whether a margin survives the load's swings from one round to the next."""

    def gbps(system: str, systems: dict[str, dict[str, Any]]) -> float | None:
        m = systems.get(system, {}).get("measurements", {}).get(batch)
        return None if m is None else m.gbps

    columns: dict[str, list[float | None]] = {
        f"{name}_gbps": [gbps(name, r[1]) for r in rounds] for name in ENGINES
    }
    columns["memcpy_gbps"] = [r[0][batch.block_bytes][0].gbps for r in rounds]
    for name, other in (("kvferry_over_nixl", "nixl_gbps"), ("kvferry_share_of_memcpy", "memcpy_gbps")):
        columns[name] = [
            None if k is None or not o else round(k / o, 3)
            for k, o in zip(columns["kvferry_gbps"], columns[other], strict=True)
        ]
    return columns


def bandwidth_row(scattered: Batch, contiguous: Batch, memcpy: tuple[Measurement, Measurement],
                  systems: dict[str, dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    row: dict[str, Any] = {"block_bytes": scattered.block_bytes, "blocks_per_batch": scattered.count,
                           "batch_bytes": scattered.nbytes}  # fmt: skip
    for name in ENGINES:
        m = systems.get(name, {}).get("measurements", {}).get(scattered)
        row.update(_columns(name, m))
    row.update(
        _columns("kvferry_contiguous", systems.get("kvferry", {}).get("measurements", {}).get(contiguous))
    )
    row.update(_columns("memcpy", memcpy[0]))
    row.update(_columns("memcpy_contiguous", memcpy[1]))
    row["targets"] = targets(row)
    return row


def _columns(prefix: str, m: Measurement | None) -> dict[str, Any]:
    if m is None:
        return {f"{prefix}_gbps": None, f"{prefix}_p50_ms": None, f"{prefix}_p99_ms": None}
    return {f"{prefix}_gbps": m.gbps, f"{prefix}_p50_ms": m.p50_ms, f"{prefix}_p99_ms": m.p99_ms,
            f"{prefix}_verified": m.verified, f"{prefix}_latencies_ms": m.latencies_ms}  # fmt: skip


def targets(row: dict[str, Any]) -> dict[str, bool | None]:
    """Issue 9's bandwidth targets, checked against this run (None where a number is missing)."""
    kvf, nixl, mc, mem = (row.get(f"{n}_gbps") for n in ("kvferry", "nixl", "mooncake_tcp", "memcpy"))
    return {
        "kvferry_ge_nixl": None if kvf is None or nixl is None else kvf >= nixl,
        "kvferry_ge_2x_mooncake_tcp": None if kvf is None or mc is None else kvf >= 2 * mc,
        "kvferry_ge_40pct_memcpy": None
        if kvf is None or mem is None or row["block_bytes"] < 64 * KiB
        else kvf >= 0.4 * mem,
    }


def _system_summary(results: dict[str, Any]) -> dict[str, Any]:
    summary = {k: v for k, v in results.items() if k != "measurements"}
    summary["available"] = "error" not in results or bool(results.get("measurements"))
    if "error" in results:
        summary["reason"] = summary.pop("error")
    return summary
