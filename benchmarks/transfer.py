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
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.harness.cli import benchmark_parser, output_dir

# Re-exported: benchmarks/pd_decision.py imports it from here (it lives in the harness now).
from benchmarks.harness.results import read_result
from benchmarks.transfer_peers.bandwidth import ENGINES, bandwidth_part
from benchmarks.transfer_peers.machine import environment_info, loadavg, wait_for_load
from benchmarks.transfer_peers.pair import Registry
from benchmarks.transfer_peers.result import payload_of, save
from benchmarks.transfer_peers.tables import markdown_tables, print_bandwidth, print_ttft
from benchmarks.transfer_peers.ttft import TTFT_TOKENS, ttft_part
from benchmarks.transfer_peers.workload import BLOCK_SIZES, SLOT_SEED, KiB, MiB


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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
