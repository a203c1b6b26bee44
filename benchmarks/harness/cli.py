"""Each benchmark's argument parser: its module docstring as the help, and where its result goes."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.harness.results import RESULTS_ENV, results_dir


def benchmark_parser(doc: str | None, name: str, out_alias: bool = True) -> argparse.ArgumentParser:
    """A parser for `python -m benchmarks.NAME` (and `kvferry bench NAME`) with --results-dir, and --out
    for the same (tests/gpu/run.sh passes --out) unless the benchmark's own --out means something else."""
    parser = argparse.ArgumentParser(
        prog=f"python -m benchmarks.{name}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        *(("--results-dir", "--out") if out_alias else ("--results-dir",)),
        dest="results_dir",
        type=Path,
        default=None,
        help=f"write the result here (default: ${RESULTS_ENV}, else benchmarks/results/; a --quick run: a temp folder)",
    )
    return parser


def output_dir(args: argparse.Namespace) -> Path:
    """Where this run's result goes (see results.results_dir)."""
    return results_dir(args.results_dir, quick=getattr(args, "quick", False))
