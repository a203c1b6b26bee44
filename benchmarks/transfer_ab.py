"""Interleaved A/B of kvferry transfer variants on a loaded machine: ratios per round, and CPU per batch.

Each variant is a pair of kvferry peers (benchmarks/transfer_peers/peer.py) importing kvferry from its own
tree (a git revision exported to a temporary folder, or a folder) with its own environment (UCX_*
settings), all pairs alive side by side. Every round measures every variant at every block size, the
order reversed on odd rounds; the load moves within a round less than between separate runs, so the
per-round ratio to the first variant is the number to read. CPU per batch (writer + target, from
/proc) is barely moved by other jobs at all. Do not put NIXL beside these: its idle progress threads
spin and take the cores the variants share. A variant's tree provides kvferry and, from the revision that
made benchmarks a package on, the peer's code too (an older tree runs this checkout's peer).

    .venv/bin/python -m benchmarks.transfer_ab --variant before=HEAD~2 --variant now=. --rounds 4
    .venv/bin/python -m benchmarks.transfer_ab --variant now=. --variant seg2m=.:UCX_CMA_SEG_SIZE=2M
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.transfer import BLOCK_SIZES, MiB, Pair, Registry, batch_for
from benchmarks.transfer_peers.workload import digest, expected_image, source_bytes

HERE = Path(__file__).resolve().parent


def tree_of(spec: str, scratch: Path) -> Path:
    """A folder as is, else a git revision of this checkout exported into `scratch`."""
    if Path(spec).is_dir():
        return Path(spec).resolve()
    folder = scratch / spec.replace("/", "_").replace("~", "-")
    folder.mkdir()
    archive = subprocess.run(["git", "archive", spec], cwd=HERE.parent, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", required=True, help="NAME=TREE[:VAR=VALUE,...]; TREE a folder or git revision")
    parser.add_argument("--block-sizes", default=",".join(str(b) for b in BLOCK_SIZES))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runs", type=int, default=8, help="timed batches per variant, size and round")
    args = parser.parse_args(argv)
    sizes = [int(b) for b in args.block_sizes.split(",")]
    source = source_bytes(64 * MiB)
    batches = {size: batch_for(size, 64 * MiB) for size in sizes}
    expected = {size: digest(expected_image(source, batch), batch.nbytes) for size, batch in batches.items()}
    with tempfile.TemporaryDirectory(prefix="kvferry-transfer-ab-") as scratch:
        pairs: dict[str, tuple[Pair, Registry]] = {}
        try:
            for spec in args.variant:
                name, _, rest = spec.partition("=")
                tree, _, settings = rest.partition(":")
                env = dict(item.split("=", 1) for item in settings.split(",") if item)
                pairs[name] = start_pair(tree_of(tree, Path(scratch)), env, Path(scratch) / f"pair-{name}")
            gbps = {(name, size): [] for name in pairs for size in sizes}
            cpu_ms = {(name, size): [] for name in pairs for size in sizes}
            print(f"load average {os.getloadavg()[0]:.2f} at the start", flush=True)
            for number in range(args.rounds):
                order = list(pairs) if number % 2 == 0 else list(pairs)[::-1]
                for size in sizes:
                    for name in order:
                        pair = pairs[name][0]
                        pids = (pair.initiator.process.pid, pair.target.process.pid)
                        before = [cpu_seconds(pid) for pid in pids]
                        measured = pair.measure(batches[size], args.runs, 2, expected[size])
                        batches_run = args.runs + 2  # the warm-up batches burn CPU too
                        cpu_ms[(name, size)].append(tuple((cpu_seconds(pid) - b) * 1e3 / batches_run for pid, b in zip(pids, before, strict=True)))
                        gbps[(name, size)].append(measured.gbps)
                print(f"round {number + 1}: " + "  ".join(f"{name}@{size // 1024}K {gbps[(name, size)][-1]:.2f}" for size in sizes for name in pairs)
                      + f"  (load {os.getloadavg()[0]:.2f})", flush=True)  # fmt: skip
        finally:
            for pair, registry in pairs.values():
                pair.stop()
                registry.close()
    first = next(iter(pairs))
    for size in sizes:
        for name in pairs:
            ratios = [x / y for x, y in zip(gbps[(name, size)], gbps[(first, size)], strict=True)]
            writer = statistics.median(c[0] for c in cpu_ms[(name, size)])
            target = statistics.median(c[1] for c in cpu_ms[(name, size)])
            print(f"{size // 1024:5d} KiB {name:10s} median {statistics.median(gbps[(name, size)]):5.2f} GB/s  "
                  f"/{first} per round {' '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f})  "
                  f"CPU per batch {writer:.1f} + {target:.1f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
