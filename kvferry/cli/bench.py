"""`kvferry loadgen`, the load generator of kvferry/loadgen/ against any OpenAI-compatible server, and
`kvferry bench NAME`, one benchmark of kvferry's suite (benchmarks/, docs/benchmarks.md).

The suite is not part of the installed package: `kvferry bench` runs it from the checkout this kvferry was
installed from (an editable install), as `python -m benchmarks.NAME` with the checkout on the path.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
BENCHMARKS = CHECKOUT / "benchmarks"
HARNESS_MARK = BENCHMARKS / "harness" / "schema.py"  # not just any `benchmarks` folder beside site-packages'


def register(subparsers: argparse._SubParsersAction) -> None:
    from kvferry.loadgen.command import add_arguments, bench

    load = subparsers.add_parser(
        "loadgen", help="load generator: streaming OpenAI requests, latency percentiles, goodput"
    )
    add_arguments(load)
    load.set_defaults(func=bench)

    suite = subparsers.add_parser(
        "bench",
        help="run a benchmark of kvferry's suite (from a checkout): kvferry bench NAME [ARGS...]",
        description="Runs benchmarks/NAME.py of this kvferry checkout; ARGS go to the benchmark "
        "(kvferry bench NAME --help lists them).",
    )
    suite.add_argument(
        "--list", action="store_true", help="list the benchmarks, each with its one-line summary"
    )
    suite.add_argument("name", nargs="?", help="the benchmark (a module under benchmarks/)")
    suite.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own arguments")
    suite.set_defaults(func=run_benchmark)


def benchmark_summaries(folder: Path = BENCHMARKS) -> dict[str, str]:
    """Each benchmark's name and its docstring's first line. A benchmark is a module of the folder that runs
    as a script (it has an `if __name__ == "__main__":` block); the others are code benchmarks share. Read
    from the source, not imported: listing loads no torch."""
    summaries = {}
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        if any(_is_main_guard(node) for node in tree.body):
            summaries[path.stem] = (ast.get_docstring(tree) or "").strip().split("\n")[0]
    return summaries


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    sides = [node.test.left, *node.test.comparators]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
        isinstance(s, ast.Constant) and s.value == "__main__" for s in sides
    )


def run_benchmark(args: argparse.Namespace) -> int:
    if not HARNESS_MARK.is_file():
        print(
            f"kvferry bench runs the benchmarks of a kvferry checkout, and this kvferry ({CHECKOUT}) is not one: "
            "benchmarks/ is not in the installed package. Install kvferry from a checkout "
            "(pip install -e .) and run it from there.",
            file=sys.stderr,
        )
        return 2
    known = benchmark_summaries()
    width = max(map(len, known))
    listing = "\n".join(f"{name.ljust(width)}  {summary}" for name, summary in known.items())
    if args.list:
        print(listing)
        return 0
    if args.name is None:
        print(f"usage: kvferry bench NAME [ARGS...] (or --list); the benchmarks:\n{listing}", file=sys.stderr)
        return 2
    if args.name not in known:
        print(
            f"kvferry bench: no benchmark {args.name!r}; the benchmarks are: {', '.join(known)}",
            file=sys.stderr,
        )
        return 2
    # `python -m benchmarks.NAME` as run from the checkout root, from wherever this command runs (so that the
    # benchmark's relative paths are the caller's).
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run([sys.executable, "-m", f"benchmarks.{args.name}", *args.args], env=env).returncode
