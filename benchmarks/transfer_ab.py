"""Interleaved A/B of kvferry transfer variants on a loaded machine: ratios per round, and CPU per batch.

Each variant is a pair of kvferry peers (benchmarks/transfer_peers/peer.py) importing kvferry from its own
tree (a git revision exported to a temporary folder, or a folder) with its own environment (UCX_*
settings), all pairs alive side by side. At each block size, every round measures every variant, the order
reversed on odd rounds; the load moves within a round less than between separate runs, so the per-round
ratio to the first variant (the baseline) is the number to read. CPU per batch (writer + target, from
/proc) is barely moved by other jobs at all. Do not put NIXL beside these: its idle progress threads
spin and take the cores the variants share. A variant's tree provides kvferry and, from the revision that
made benchmarks a package on, the peer's code too (an older tree runs this checkout's peer).

    .venv/bin/python -m benchmarks.transfer_ab --variant before=HEAD~2 --variant now=. --rounds 4
    .venv/bin/python -m benchmarks.transfer_ab --variant now=. --variant seg2m=.:UCX_CMA_SEG_SIZE=2M
    .venv/bin/python -m benchmarks.transfer_ab --variant before=HEAD --variant now=. --batch-bytes 1048576 \
        --block-sizes 16384,65536,1048576 --rounds 6 --runs 40   # a write's fixed cost (1 MiB batches)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import environment
from benchmarks.harness.processes import cpu_seconds
from benchmarks.harness.results import new_result, write_result
from benchmarks.harness.side_by_side import side_by_side
from benchmarks.transfer_peers.pair import Pair, Registry
from benchmarks.transfer_peers.workload import (
    BLOCK_SIZES,
    Batch,
    MiB,
    batch_for,
    digest,
    expected_image,
    source_bytes,
)

HERE = Path(__file__).resolve().parent


def tree_of(spec: str, scratch: Path) -> Path:
    """A folder as is, else a git revision of this checkout exported into `scratch`."""
    if Path(spec).is_dir():
        return Path(spec).resolve()
    folder = scratch / spec.replace("/", "_").replace("~", "-")
    folder.mkdir()
    archive = subprocess.run(
        ["git", "archive", spec], cwd=HERE.parent, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def measure(pair: Pair, batch: Batch, expected: str, runs: int) -> Callable[[], dict[str, float]]:
    """One variant's measurement at one block size: GB/s, and the CPU time per batch of its writer and its
    target (from /proc: barely moved by other jobs, unlike the GB/s)."""

    def run() -> dict[str, float]:
        pids = (pair.initiator.process.pid, pair.target.process.pid)
        before = [cpu_seconds(pid) for pid in pids]
        measured = pair.measure(batch, runs, 2, expected)
        batches_run = runs + 2  # the warm-up batches burn CPU too
        writer, target = (
            (cpu_seconds(pid) - b) * 1e3 / batches_run for pid, b in zip(pids, before, strict=True)
        )
        return {"gbps": measured.gbps, "writer_cpu_ms": writer, "target_cpu_ms": target}

    return run


def start_pair(tree: Path, env: dict[str, str], workdir: Path) -> tuple[Pair, Registry]:
    """The pair with its own registry: every pair's peers have the same names."""
    workdir.mkdir()
    registry = Registry(workdir)
    saved = dict(os.environ)
    os.environ.update({**env, "PYTHONPATH": str(tree)})  # Peer.start hands os.environ to the peers
    try:
        return Pair.start("kvferry", 64 * MiB, registry.url, workdir), registry
    except BaseException:
        registry.close()
        raise
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, "transfer_ab")
    parser.add_argument(
        "--variant",
        action="append",
        required=True,
        help="NAME=TREE[:VAR=VALUE,...]; TREE a folder or git revision",
    )
    parser.add_argument("--block-sizes", default=",".join(str(b) for b in BLOCK_SIZES))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runs", type=int, default=8, help="timed batches per variant, size and round")
    parser.add_argument("--batch-bytes", type=int, default=64 * MiB,
                        help="bytes a batch writes (at most 64 MiB); small batches time a write's fixed cost")
    args = parser.parse_args(argv)
    if not 0 < args.batch_bytes <= 64 * MiB:
        parser.error("--batch-bytes must be between 1 and 64 MiB")
    sizes = [int(b) for b in args.block_sizes.split(",")]
    source = source_bytes(64 * MiB)
    batches = {size: batch_for(size, args.batch_bytes) for size in sizes}
    expected = {size: digest(expected_image(source, batch), batch.nbytes) for size, batch in batches.items()}
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kvferry-transfer-ab-") as scratch:
        pairs: dict[str, tuple[Pair, Registry]] = {}
        try:
            for spec in args.variant:
                name, _, rest = spec.partition("=")
                tree, _, settings = rest.partition(":")
                env = dict(item.split("=", 1) for item in settings.split(",") if item)
                pairs[name] = start_pair(tree_of(tree, Path(scratch)), env, Path(scratch) / f"pair-{name}")
            print(f"load average {load_at_start[0]:.2f} at the start", flush=True)
            measured = {size: side_by_side({name: measure(pair, batches[size], expected[size], args.runs)
                                            for name, (pair, _) in pairs.items()}, args.rounds)
                        for size in sizes}  # fmt: skip
        finally:
            for pair, registry in pairs.values():
                pair.stop()
                registry.close()
    first = next(iter(pairs))
    rows = []
    for size in sizes:
        for name in pairs:
            runs = measured[size][name]
            gbps = [m["gbps"] for m in runs]
            ratios = [x / y["gbps"] for x, y in zip(gbps, measured[size][first], strict=True)]
            rows.append({"variant": name, "block_bytes": size, "gbps_median": statistics.median(gbps),
                         "gbps_per_round": gbps, "gbps_over_baseline_per_round": [round(r, 3) for r in ratios],
                         "gbps_over_baseline_median": round(statistics.median(ratios), 3),
                         "writer_cpu_ms_per_batch": statistics.median(m["writer_cpu_ms"] for m in runs),
                         "target_cpu_ms_per_batch": statistics.median(m["target_cpu_ms"] for m in runs)})  # fmt: skip
            row = rows[-1]
            print(f"{size // 1024:5d} KiB {name:10s} median {row['gbps_median']:5.2f} GB/s  /{first} per round "
                  f"{' '.join(f'{r:.2f}' for r in ratios)} (median {row['gbps_over_baseline_median']:.2f})  "
                  f"CPU per batch {row['writer_cpu_ms_per_batch']:.1f} + {row['target_cpu_ms_per_batch']:.1f} ms")  # fmt: skip
    params = {"variants": args.variant, "block_sizes": sizes, "batch_bytes": args.batch_bytes, "rounds": args.rounds,
              "runs": args.runs}
    load_avg = {"start": list(load_at_start), "end": list(os.getloadavg())}
    result = new_result(
        "transfer_ab", params, rows, baseline=first, environment={**environment(), "load_avg": load_avg}
    )
    print(f"wrote {write_result(result, output_dir(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
