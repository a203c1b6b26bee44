"""Benchmark commands: `kvferry bench` (the load generator of kvferry/loadgen/) and `kvferry bench-transfer`.

bench-transfer runs benchmarks/transfer.py from a source checkout: the benchmarks are not part of the wheel
(they pull in NIXL and Mooncake for comparison); this command finds them beside the package and passes
every argument through.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def register(subparsers: argparse._SubParsersAction) -> None:
    from kvferry.loadgen.command import add_arguments, bench

    load = subparsers.add_parser("bench", help="load generator: streaming OpenAI requests, latency percentiles, goodput")
    add_arguments(load)
    load.set_defaults(func=bench)

    parser = subparsers.add_parser(
        "bench-transfer", help="KV transfer benchmark: kvferry vs NIXL vs Mooncake TCP vs memcpy", add_help=False
    )
    parser.set_defaults(func=_bench_transfer, pass_through=True, arguments=[])


def _bench_transfer(args: argparse.Namespace) -> int:
    script = BENCHMARKS / "transfer.py"
    if not script.is_file():
        print(f"kvferry bench-transfer runs from a source checkout: {script} is missing", file=sys.stderr)
        return 2
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("kvferry_transfer_benchmark", script)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return int(module.main(args.arguments) or 0)
