"""Transfer benchmark: kvferry's TransferEngine beside NIXL, Mooncake's TCP engine and a memcpy, on loopback.

Every system moves the same data: a 64 MiB batch of 16 KiB / 64 KiB / 256 KiB / 1 MiB blocks from a
source buffer in one process into a destination buffer in another process (127.0.0.1 only). Block i
goes to slot slots[i] of a random permutation with no two consecutive blocks landing in consecutive
slots, so no engine can merge neighbouring descriptors into one range (a KV cache's blocks are
scattered the same way). kvferry also runs a "contiguous" variant (block i to slot i), which its engine
coalesces into one message. The memcpy column copies the same blocks to the same slots in one process
and one thread (numpy fancy assignment: a memcpy per block), the limit any engine could reach.

Each system runs in its own pair of processes, one system at a time (an idle engine's progress threads
would otherwise share the two cores with the one being measured). Per block size: warm-up batches,
then a checksum of the destination against the expected image, then timed batches. GB/s is batch bytes
(GB = 1e9 bytes) over the median batch time; p50/p99 are batch latencies in ms.

`--part ttft` adds the share of TTFT that shipping a prompt's KV would take on the `small` checkpoint:
TTFT is kvferry's engine prefilling the prompt and producing one token; transfer is kvferry's
TransferEngine moving that prompt's KV blocks between two processes, coalesced as the KV connector does.

    .venv/bin/python -m benchmarks.transfer                  # both parts, writes benchmarks/results/transfer.json
    .venv/bin/python -m benchmarks.transfer --quick          # a smoke run: 2 sizes, 8 MiB batches, a temp folder
    .venv/bin/python -m benchmarks.transfer --part bandwidth --wait-load 2.5
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import cached_model, environment
from benchmarks.harness.processes import start_logged, stop
from benchmarks.harness.results import new_result, read_result, write_result
from benchmarks.harness.schema import BenchmarkResult
from benchmarks.harness.table import print_table
from benchmarks.harness.warmup import timed_runs
from benchmarks.transfer_peers.workload import Batch, digest, expected_image, source_bytes
from kvferry.cli.redis_server import RedisServer

HERE = Path(__file__).resolve().parent

PEER = "benchmarks.transfer_peers.peer"
MiB = 1 << 20
KiB = 1 << 10
BLOCK_SIZES = (16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB)
ENGINES = ("kvferry", "nixl", "mooncake_tcp")
SLOT_SEED = 7  # the permutation of destination slots, per block size (the same for every system)
PEER_TIMEOUT_S = 180.0  # one command of a peer; a 64 MiB batch at 0.1 GB/s is well inside
INSTALL_HINT = {
    "nixl": ".venv/bin/uv pip install --python .venv/bin/python -e '.[bench]'   (brings nixl-cu12)",
    "mooncake_tcp": "apt-get update && apt-get install -y libibverbs1; "
    ".venv/bin/uv pip install --python .venv/bin/python -e '.[bench]'   (brings mooncake-transfer-engine-non-cuda)",
}
# Mooncake's TCP transport refuses a batch deeper than its per-peer queue (here 2048 descriptors pass and
# 3000 fail with "TCP lane queue-full rejection" and status -1, so 4096 x 16 KiB fails); its own knob
# lets the same single batch through.
# kvferry's target holds its buffer in memory the engine allocated, as a decode node's CPU pool does
# (docs/transfer.md, item 9); named here so that the results file records it.
SYSTEM_ENV = {
    "mooncake_tcp": {"MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER": "8192"},
    "kvferry": {"KVFERRY_BENCH_TARGET_MEMORY": "managed"},
}
# TTFT part: the `small` checkpoint in float32 (12 layers, 4 KV heads, head dim 64: 24 KiB of KV per token).
TTFT_TOKENS = (128, 512, 2048, 8192)
KV_BLOCK_TOKENS = 16
TTFT_MAX_MODEL_LEN = 8704


class PeerError(RuntimeError):
    pass


# ---- peer processes ---------------------------------------------------------------------------------
@dataclass
class Peer:
    """A peer process (benchmarks.transfer_peers.peer) and the two pipes that drive it."""

    process: subprocess.Popen[bytes]
    commands: Any
    replies: Any
    log: Path
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(
        cls, system: str, role: str, buffer_bytes: int, registry: str, log: Path, env: dict[str, str]
    ) -> Peer:
        cmd_read, cmd_write = os.pipe()
        reply_read, reply_write = os.pipe()
        # UCX prints the protocol and transports each endpoint picked; read back from the log afterwards.
        env = {"UCX_PROTO_INFO": "y", **env, **os.environ}  # what the caller exported wins
        # The peer is a module of this checkout's benchmarks package. -P keeps the working directory off its
        # sys.path, so a PYTHONPATH that transfer_ab.py points at another tree provides kvferry (and that
        # tree's benchmarks package, where it has one); this checkout comes after it.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(HERE.parent)]))
        argv = [sys.executable, "-P", "-m", PEER, "--system", system, "--role", role, "--name", f"{system}-{role}",
                "--buffer-bytes", str(buffer_bytes), "--cmd-fd", str(cmd_read), "--reply-fd", str(reply_write),
                "--registry", registry]  # fmt: skip
        process = start_logged(argv, log, env, pass_fds=(cmd_read, reply_write))
        os.close(cmd_read)
        os.close(reply_write)
        peer = cls(process, os.fdopen(cmd_write, "w"), os.fdopen(reply_read, "r"), log)
        peer.info = peer._reply(PEER_TIMEOUT_S)["info"]
        return peer

    def call(self, cmd: str, timeout: float = PEER_TIMEOUT_S, **fields: Any) -> dict[str, Any]:
        try:
            self.commands.write(json.dumps({"cmd": cmd, **fields}) + "\n")
            self.commands.flush()
        except BrokenPipeError as exc:
            raise PeerError(f"{self.log.stem} exited ({self.tail()})") from exc
        return self._reply(timeout)

    def _reply(self, timeout: float) -> dict[str, Any]:
        ready, _, _ = select.select([self.replies], [], [], timeout)
        line = self.replies.readline() if ready else ""
        if not line:
            raise PeerError(f"{self.log.stem} gave no answer within {timeout:.0f} s ({self.tail()})")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise PeerError(f"{self.log.stem}: {reply.get('error')}")
        return reply

    def tail(self, lines: int = 3) -> str:
        text = self.log.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "no output"

    def stop(self) -> None:
        try:
            if self.process.poll() is None:
                self.call("quit", timeout=10)
        except (PeerError, OSError, ValueError):
            pass
        stop(self.process)


@dataclass
class Pair:
    target: Peer
    initiator: Peer

    @classmethod
    def start(cls, system: str, buffer_bytes: int, registry: str, logs: Path) -> Pair:
        env = SYSTEM_ENV.get(system, {})
        target = Peer.start(system, "target", buffer_bytes, registry, logs / f"{system}-target.log", env)
        try:
            initiator = Peer.start(
                system, "initiator", buffer_bytes, registry, logs / f"{system}-initiator.log", env
            )
        except BaseException:
            target.stop()
            raise
        pair = cls(target, initiator)
        try:
            initiator.call("connect", remote=target.info)
            target.call("connect", remote=initiator.info)
        except BaseException:
            pair.stop()
            raise
        return pair

    def stop(self) -> None:
        self.initiator.stop()
        self.target.stop()

    def measure(
        self, batch: Batch, runs: int, warmup: int, expected: str, coalesce: bool = False
    ) -> Measurement:
        """Clear the destination, warm up, check the checksum, then time `runs` batches."""
        self.target.call("clear")
        self.initiator.call("run", batch=batch.to_json(), runs=warmup, coalesce=coalesce)
        arrived = self.target.call("digest", nbytes=batch.nbytes)["digest"]
        if arrived != expected:
            raise PeerError(f"destination checksum {arrived} != expected {expected} for {batch}")
        latencies = self.initiator.call("run", batch=batch.to_json(), runs=runs, coalesce=coalesce)[
            "latencies"
        ]
        return Measurement.of(batch.nbytes, latencies, verified=True)


@dataclass(frozen=True)
class Measurement:
    gbps: float
    p50_ms: float
    p99_ms: float
    latencies_ms: list[float]
    verified: bool

    @classmethod
    def of(cls, nbytes: int, latencies_s: Sequence[float], verified: bool) -> Measurement:
        ms = np.asarray(latencies_s) * 1e3
        p50 = float(np.percentile(ms, 50))
        return cls(round(nbytes / (p50 / 1e3) / 1e9, 3), round(p50, 3), round(float(np.percentile(ms, 99)), 3),
                   [round(float(x), 3) for x in ms], verified)  # fmt: skip


# ---- helpers ----------------------------------------------------------------------------------------
class Registry:
    """kvferry's peers find each other through Redis as in production (a redis-server started here on
    a free loopback port), or through files when redis-server is not installed."""

    def __init__(self, workdir: Path) -> None:
        self.server: RedisServer | None = None
        if shutil.which("redis-server") is None:
            self.url, self.kind = f"file:{workdir}", "files (redis-server not installed)"
            return
        self.server = RedisServer(workdir)
        self.url, self.kind = self.server.url, "redis-server on loopback"

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def wait_for_load(limit: float, max_minutes: float, poll_s: float = 120.0) -> dict[str, Any]:
    """Poll the 1-minute load average until it drops below `limit` (other jobs share this machine)."""
    start = time.monotonic()
    seen = [loadavg()[0]]
    while seen[-1] >= limit and time.monotonic() - start < max_minutes * 60:
        print(f"load average {seen[-1]} >= {limit}; waiting {poll_s:.0f} s", flush=True)
        time.sleep(poll_s)
        seen.append(loadavg()[0])
    return {
        "limit": limit,
        "waited_s": round(time.monotonic() - start),
        "dropped_below": seen[-1] < limit,
        "seen": seen,
    }


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], cwd=HERE.parent, capture_output=True, text=True)
        return result.stdout.strip()

    # The transfer engine may be mid-change in the working tree: name the state that was measured.
    sources = hashlib.sha1()
    for path in sorted((HERE.parent / "transfer").glob("*.py")):
        sources.update(path.name.encode() + path.read_bytes())
    return {"commit": git("rev-parse", "--short", "HEAD"), "uncommitted_in_transfer": git("status", "--short", "transfer"),
            "transfer_sources_sha1": sources.hexdigest()[:12]}  # fmt: skip


PROTO_ROW = re.compile(
    r"\|\s*(?P<range>\d[\w.]*(?:\.\.\w+)?)\s*\|\s*(?P<proto>[^|]+?)\s*\|\s*(?P<lanes>[^|]+?)\s*\|\s*$"
)


def ucx_transports(log: Path) -> dict[str, list[str]]:
    """What UCX_PROTO_INFO=y printed: for each operation ('tagged message by ucp_tag_send* from host
    memory', 'remote memory write by ucp_put* ...'), its 'range: protocol on lanes' rows, deduplicated.
    Enough to tell shared memory or CMA from tcp/lo."""
    tables: dict[str, list[str]] = {}
    title = ""
    for line in log.read_text(errors="replace").splitlines():
        if " by ucp_" in line:
            title = next(part.strip() for part in line.split("|") if " by ucp_" in part)
            tables.setdefault(title, [])
            continue
        match = PROTO_ROW.search(line)
        if title and match and match["proto"] != "Description":
            row = f"{match['range']}: {match['proto']} on {match['lanes']}"
            if row not in tables[title]:
                tables[title].append(row)
    return tables


# ---- the bandwidth part -----------------------------------------------------------------------------
def batch_for(block_bytes: int, batch_bytes: int, contiguous: bool = False) -> Batch:
    return Batch(block_bytes, batch_bytes // block_bytes, None if contiguous else SLOT_SEED)


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
            print(f"  {system:13s} {_size(batch.block_bytes):>7s} x {batch.count:5d}{' contiguous' if batch.seed is None else ''}: "
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


def _size(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"


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
            f"  memcpy        {_size(batch.block_bytes):>7s}: {memcpy[batch.block_bytes][0].gbps:7.3f} GB/s",
            flush=True,
        )
    systems: dict[str, dict[str, Any]] = {}
    for system in order:
        batches = scattered + contiguous if system == "kvferry" else scattered
        systems[system] = measure_engine(system, batches, expected, args, registry.url, logs)
        if "error" in systems[system]:
            print(f"  {system}: no numbers: {systems[system]['error']}", flush=True)
    return memcpy, systems


def pooled(nbytes: int, measurements: list[Measurement]) -> Measurement:
    """One measurement from every round's timed batches (the median batch of them all)."""
    if len(measurements) == 1:
        return measurements[0]
    latencies = [ms / 1e3 for m in measurements for ms in m.latencies_ms]
    return Measurement.of(nbytes, latencies, all(m.verified for m in measurements))


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


# ---- the TTFT part ----------------------------------------------------------------------------------
def kv_bytes_per_token(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 4  # float32


def long_context_copy(model_dir: Path, max_len: int) -> tuple[Path, str | None]:
    """The checkpoint with max_position_embeddings raised to `max_len` when it is lower (the `small`
    checkpoint says 4096, and the engine caps max_model_len there): same weights, linked, and only the
    config changed. Random weights make nothing of positions either way; the cost of a prefill does."""
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("max_position_embeddings", 0) >= max_len:
        return model_dir, None
    folder = model_dir.parent / f"{model_dir.name}-ctx{max_len}"
    folder.mkdir(parents=True, exist_ok=True)
    for path in model_dir.iterdir():
        link = folder / path.name
        if path.name != "config.json" and not link.exists():
            link.symlink_to(path)
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": max_len}, indent=2))
    return (
        folder,
        f"max_position_embeddings raised from {config.get('max_position_embeddings')} to {max_len} (same weights)",
    )


def measure_ttft(
    model_dir: Path, tokens: Sequence[int], repeats: int, max_seconds: float
) -> dict[int, dict[str, Any]]:
    """Prefill + first token for fresh random prompts (no prefix-cache hits). A length runs `repeats`
    times if its first run took under 10 s, else once; a length is skipped when the shorter ones
    predict (quadratically) that it would take longer than `max_seconds`."""
    from kvferry.engine import LLM, SamplingParams

    config = json.loads((model_dir / "config.json").read_text())
    blocks = math.ceil(TTFT_MAX_MODEL_LEN / KV_BLOCK_TOKENS) + 8
    llm = LLM(model_dir, dtype="float32", max_model_len=TTFT_MAX_MODEL_LEN, num_kv_blocks=blocks)
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)

    def once(n: int) -> float:
        prompt = {"prompt_token_ids": rng.integers(0, config["vocab_size"], n).tolist()}
        start = time.perf_counter()
        outputs = llm.generate([prompt], [params])
        elapsed = time.perf_counter() - start
        assert len(outputs[0].outputs[0].token_ids) == 1
        return elapsed

    once(64)  # warm-up: first-call allocations and kernel selection
    results: dict[int, dict[str, Any]] = {}
    previous: tuple[int, float] | None = None
    for n in tokens:
        predicted = previous[1] * (n / previous[0]) ** 2 if previous else 0.0
        if predicted > max_seconds:
            results[n] = {"skipped": f"predicted {predicted:.0f} s > --ttft-max-seconds {max_seconds:.0f}"}
            continue
        times = [once(n)]
        times += [once(n) for _ in range(repeats - 1 if times[0] < 10 else 0)]
        results[n] = {"ttft_ms": round(float(np.median(times)) * 1e3, 1), "ttft_runs_ms": [round(t * 1e3, 1) for t in times],
                      "load_after": loadavg()}  # fmt: skip
        previous = (n, float(np.median(times)))
        print(f"  TTFT {n:5d} tokens: {results[n]['ttft_ms']:9.1f} ms ({len(times)} run(s))", flush=True)
    return results


def ttft_part(args: argparse.Namespace, registry: Registry, logs: Path) -> dict[str, Any]:
    model_dir, model_note = long_context_copy(cached_model("llama", "small"), TTFT_MAX_MODEL_LEN)
    per_token = kv_bytes_per_token(model_dir)
    block_bytes = per_token * KV_BLOCK_TOKENS
    load_before = loadavg()
    ttft = measure_ttft(model_dir, args.ttft_tokens, args.ttft_repeats, args.ttft_max_seconds)
    counts = {n: math.ceil(n / KV_BLOCK_TOKENS) for n in args.ttft_tokens}
    runs = {n: (Batch(block_bytes, c, None), Batch(block_bytes, c, SLOT_SEED)) for n, c in counts.items()}
    source = source_bytes(block_bytes * max(counts.values()))
    pair = Pair.start("kvferry", block_bytes * max(counts.values()), registry.url, logs)
    rows = []
    try:
        for n in args.ttft_tokens:
            coalesced, fragmented = runs[n]
            m = pair.measure(
                coalesced,
                args.runs,
                args.warmup,
                digest(expected_image(source, coalesced), coalesced.nbytes),
                coalesce=True,
            )
            f = pair.measure(
                fragmented,
                args.runs,
                args.warmup,
                digest(expected_image(source, fragmented), fragmented.nbytes),
                coalesce=True,
            )
            rows.append(ttft_row(n, coalesced, m, f, ttft[n]))
            print(f"  transfer {n:5d} tokens ({_size(coalesced.nbytes)}): {m.p50_ms:8.2f} ms coalesced, "
                  f"{f.p50_ms:8.2f} ms as {coalesced.count} scattered blocks", flush=True)  # fmt: skip
    finally:
        pair.stop()
    return {"model": f"llama-small ({model_dir.name}), float32, block_size {KV_BLOCK_TOKENS}", "model_note": model_note,
            "kv_bytes_per_token": per_token, "kv_bytes_per_block": block_bytes, "rows": rows,
            "load_before": load_before, "load_after": loadavg()}  # fmt: skip


def ttft_row(
    tokens: int, batch: Batch, coalesced: Measurement, fragmented: Measurement, ttft: dict[str, Any]
) -> dict[str, Any]:
    ttft_ms = ttft.get("ttft_ms")
    return {
        "prompt_tokens": tokens,
        "kv_blocks": batch.count,
        "kv_bytes": batch.nbytes,
        "ttft_ms": ttft_ms,
        "ttft_note": ttft.get("skipped"),
        "transfer_ms": coalesced.p50_ms,
        "transfer_p99_ms": coalesced.p99_ms,
        "transfer_gbps": coalesced.gbps,
        "transfer_share_of_ttft": None if ttft_ms is None else round(coalesced.p50_ms / ttft_ms, 4),
        # The same blocks landing in scattered destination blocks: one message per 384 KiB block.
        "transfer_scattered_ms": fragmented.p50_ms,
        "transfer_scattered_share_of_ttft": None
        if ttft_ms is None
        else round(fragmented.p50_ms / ttft_ms, 4),
        "verified": coalesced.verified and fragmented.verified,
    }


# ---- output -----------------------------------------------------------------------------------------
def print_bandwidth(rows: list[dict[str, Any]]) -> None:
    columns = ["block", "kvferry_gbps", "nixl_gbps", "mooncake_tcp_gbps", "memcpy_gbps", "kvferry_contiguous_gbps",
               "kvferry_p50_ms", "kvferry_p99_ms", "nixl_p99_ms", "mooncake_tcp_p99_ms"]  # fmt: skip
    print_table([{"block": _size(r["block_bytes"]), **r} for r in rows], columns)
    for r in rows:
        if "rounds" in r:
            ratios = {name: r["rounds"][name] for name in ("kvferry_over_nixl", "kvferry_share_of_memcpy")}
            print(
                f"{_size(r['block_bytes']):>7s} per round: "
                + "; ".join(f"{k} {v}" for k, v in ratios.items())
            )


def print_ttft(rows: list[dict[str, Any]]) -> None:
    table = [
        {
            **r,
            "kv": _size(r["kv_bytes"]),
            "share": "-"
            if r["transfer_share_of_ttft"] is None
            else f"{100 * r['transfer_share_of_ttft']:.2f}%",
        }
        for r in rows
    ]
    print_table(table, ["prompt_tokens", "kv", "ttft_ms", "transfer_ms", "share", "transfer_scattered_ms"])


def _cell(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def markdown_tables(payload: dict[str, Any]) -> str:
    """The tables of docs/benchmarks.md's Transfer section, from a results file."""
    lines = [] if not payload.get("rows") else ["| block | kvferry GB/s | NIXL GB/s | Mooncake TCP GB/s | memcpy GB/s | kvferry contiguous GB/s "
             "| kvferry p50 / p99 ms | NIXL p50 / p99 ms | Mooncake TCP p50 / p99 ms |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in payload.get("rows", []):
        pairs = [f"{_cell(r[f'{n}_p50_ms'], 1)} / {_cell(r[f'{n}_p99_ms'], 1)}" for n in ENGINES]
        lines.append(f"| {_size(r['block_bytes'])} | {_cell(r['kvferry_gbps'])} | {_cell(r['nixl_gbps'])} "
                     f"| {_cell(r['mooncake_tcp_gbps'])} | {_cell(r['memcpy_gbps'])} | {_cell(r['kvferry_contiguous_gbps'])} "
                     f"| {' | '.join(pairs)} |")  # fmt: skip
    ttft = payload.get("ttft", {}).get("rows", [])
    if ttft:
        lines += [""] * bool(lines) + ["| prompt tokens | KV bytes | TTFT ms | transfer ms (coalesced) | share of TTFT "
                  "| transfer ms (scattered blocks) | share |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in ttft:
            share = (
                _cell(None if r["transfer_share_of_ttft"] is None else 100 * r["transfer_share_of_ttft"])
                + " %"
            )
            scattered = (
                _cell(
                    None
                    if r["transfer_scattered_share_of_ttft"] is None
                    else 100 * r["transfer_scattered_share_of_ttft"]
                )
                + " %"
            )
            lines.append(f"| {r['prompt_tokens']} | {_size(r['kv_bytes'])} | {_cell(r['ttft_ms'], 0)} | {_cell(r['transfer_ms'])} "
                         f"| {share} | {_cell(r['transfer_scattered_ms'])} | {scattered} |")  # fmt: skip
    return "\n".join(lines)


def environment_info(registry: Registry) -> dict[str, Any]:
    return {
        **environment(),
        "cpu_count": os.cpu_count(),
        "packages": {
            name: package_version(name)
            for name in (
                "ucxx-cu13",
                "libucx-cu13",
                "nixl-cu12",
                "mooncake-transfer-engine-non-cuda",
                "numpy",
            )
        },  # fmt: skip
        "registry": registry.kind,
        "git": git_state(),
        "loopback_only": "127.0.0.1",
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, "transfer", out_alias=False)
    parser.add_argument("--part", choices=("all", "bandwidth", "ttft"), default="all")
    parser.add_argument(
        "--systems", default=",".join(ENGINES), help="comma-separated subset of " + ",".join(ENGINES)
    )
    parser.add_argument(
        "--block-sizes", default=",".join(str(b) for b in BLOCK_SIZES), help="bytes, comma-separated"
    )
    parser.add_argument("--batch-mib", type=int, default=64)
    parser.add_argument("--runs", type=int, default=20, help="timed batches per block size (at least 5)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="bandwidth rounds (memcpy, then each system; pooled, with per-round ratios)",
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--ttft-tokens", default=",".join(str(t) for t in TTFT_TOKENS))
    parser.add_argument(
        "--ttft-repeats", type=int, default=3, help="TTFT runs per prompt length up to 2048 tokens"
    )
    parser.add_argument(
        "--ttft-max-seconds", type=float, default=300.0, help="skip a prompt predicted to take longer"
    )
    parser.add_argument(
        "--wait-load",
        type=float,
        default=None,
        help="first wait for the 1-min load average to drop below this",
    )
    parser.add_argument("--wait-minutes", type=float, default=30.0)
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 block sizes, 8 MiB batches, 128/512 tokens"
    )
    parser.add_argument(
        "--output", type=Path, default=None, help="the result file (default: transfer.json in --results-dir)"
    )
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--markdown", action="store_true", help="print the docs tables from the results file and exit"
    )
    parser.add_argument(
        "--logs", type=Path, default=None, help="keep the peers' logs (UCX_PROTO_INFO tables) here"
    )
    args = parser.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    args.block_sizes = [int(b) for b in args.block_sizes.split(",")]
    args.ttft_tokens = [int(t) for t in args.ttft_tokens.split(",")]
    if args.quick:
        args.block_sizes, args.batch_mib, args.runs, args.warmup = [64 * KiB, 1 * MiB], 8, 5, 1
        args.ttft_tokens, args.ttft_repeats = [128, 512], 1
    args.output = args.output or output_dir(args) / "transfer.json"
    args.warmup = max(1, args.warmup)  # the checksum is taken after the warm-up batches
    args.batch_bytes = args.batch_mib * MiB
    unknown = set(args.systems) - set(ENGINES)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.markdown:
        print(markdown_tables(payload_of(read_result(args.output))))
        return 0
    waited = wait_for_load(args.wait_load, args.wait_minutes) if args.wait_load else None
    # One part alone keeps the other part's numbers from the results file.
    payload = payload_of(read_result(args.output)) if args.output.is_file() and args.part != "all" else {}
    with tempfile.TemporaryDirectory(prefix="kvferry-bench-transfer-") as workdir:
        logs = args.logs or Path(workdir)
        logs.mkdir(parents=True, exist_ok=True)
        registry = Registry(logs)
        try:
            env = {**environment_info(registry), "load_average_start": loadavg(), "load_wait": waited}
            if args.part in ("all", "bandwidth"):
                payload["environment"] = env
                print(
                    f"bandwidth: {args.batch_mib} MiB batches, {args.warmup} warm-up + {args.runs} timed each",
                    flush=True,
                )
                payload.update(bandwidth_part(args, registry, logs))
                env["ucx_versions"] = {
                    name: sorted(set(summary.get("ucx_versions", {}).values()))
                    for name, summary in payload["systems"].items()
                }
                payload["settings"] = {"batch_bytes": args.batch_bytes, "runs": args.runs, "warmup": args.warmup,
                                       "gbps": "batch bytes / median batch time, GB = 1e9 bytes", "slot_seed": SLOT_SEED}  # fmt: skip
                save(args, payload)  # a failure in the TTFT part keeps these numbers
            if args.part in ("all", "ttft"):
                print("TTFT share (kvferry engine prefill vs kvferry TransferEngine)", flush=True)
                try:
                    payload["ttft"] = ttft_part(args, registry, logs)
                except Exception as exc:  # noqa: BLE001 - recorded; the bandwidth numbers of this run stay
                    payload["ttft"] = {"error": f"{type(exc).__name__}: {exc}", "rows": []}
                if args.part == "ttft":  # the bandwidth part's environment stays as it was measured
                    payload["ttft"]["environment"] = env
            env["load_average_end"] = loadavg()
        finally:
            registry.close()
    print()
    if payload.get("rows"):
        print_bandwidth(payload["rows"])
    if payload.get("ttft", {}).get("rows"):
        print()
        print_ttft(payload["ttft"]["rows"])
    if payload.get("ttft", {}).get("error"):
        print(f"TTFT part failed: {payload['ttft']['error']}")
    for name, summary in payload.get("systems", {}).items():
        if not summary.get("available"):
            print(f"{name}: not measured: {summary.get('reason')}\n  install: {summary.get('install')}")
    path = save(args, payload)
    if path is not None:
        print(f"wrote {path}")
    return 0


def result_of(payload: dict[str, Any]) -> BenchmarkResult:
    """The suite's result from this benchmark's working payload: the settings are its params, a row per
    block size, the systems' details and the TTFT part in the summary."""
    summary = {key: payload[key] for key in ("systems", "ttft") if key in payload}
    return new_result("transfer", payload.get("settings", {}), payload.get("rows", []), summary=summary,
                      environment=payload.get("environment") or environment())  # fmt: skip


def payload_of(result: BenchmarkResult) -> dict[str, Any]:
    """The working payload back from a result (result_of's inverse), to add one part's numbers to."""
    return {
        "environment": result.environment,
        "settings": result.params,
        "rows": result.rows,
        **result.summary,
    }


def save(args: argparse.Namespace, payload: dict[str, Any]) -> Path | None:
    if args.no_write:
        return None
    return write_result(result_of(payload), args.output.parent, args.output.stem)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
