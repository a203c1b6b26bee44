"""Flakiness: the integration and e2e tiers run again and again, each run's failures recorded by name.

Not a test and not in CI: a bounded loop (--runs, and --hours, after which no new run starts) of
`pytest TIERS` in a process of its own, on the checkout as it is. A run that fails is recorded with the
names of its failing tests and the tail of their reports, and the loop goes on: the point is how often
each fails, not the first failure. The result is written after every run, so a loop cut short keeps what
it measured; --append adds to the runs already recorded for the same code (the last commit that changed
anything the tiers run: outside docs/, benchmarks/ and the tiers they leave out), so runs of several
sittings add up.

    .venv/bin/python -m benchmarks.repeated_tiers                # 10 runs -> benchmarks/results/repeated_tiers.json
    .venv/bin/python -m benchmarks.repeated_tiers --runs 3 --hours 1.5 --append
    .venv/bin/python -m benchmarks.repeated_tiers --quick        # one run of one small module: a smoke run
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.results import new_result, params_of, read_result, write_result
from benchmarks.harness.table import print_table

CHECKOUT = Path(__file__).resolve().parent.parent
TIERS = ["tests/integration", "tests/e2e"]
QUICK_TIERS = ["tests/e2e/test_request_validation.py"]
REPORT_CHARS = 1500  # of each failure's report kept in the result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, "repeated_tiers")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--hours", type=float, default=6.0, help="no run starts after this long")
    parser.add_argument("--tiers", nargs="+", default=TIERS)
    parser.add_argument("--append", action="store_true", help="add to the recorded runs of this same commit")
    parser.add_argument("--quick", action="store_true", help="one run of one small module")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.hours <= 0:
        parser.error("--runs must be at least 1 and --hours above 0")
    if args.quick:
        args.runs, args.tiers = 1, QUICK_TIERS
    return args


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=CHECKOUT, capture_output=True, text=True, check=True).stdout.strip()


def _failures(junit: Path) -> tuple[dict[str, int], list[dict[str, str]]]:
    """Counts (tests, failures, errors, skipped) and each failing test's name and report, from pytest's
    JUnit XML."""
    suite = ElementTree.parse(junit).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    assert suite is not None, f"{junit} holds no testsuite"
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    failed = []
    for case in suite.iter("testcase"):
        for outcome in ("failure", "error"):
            element = case.find(outcome)
            if element is not None:
                name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
                failed.append({"test": name, "outcome": outcome,
                               "report": (element.get("message", "") + "\n" + (element.text or ""))[-REPORT_CHARS:]})
    return counts, failed


def run_once(index: int, tiers: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvferry-repeated-") as folder:
        junit = Path(folder) / "junit.xml"
        started = time.monotonic()
        # -p no:cacheprovider: a run must not reorder or skip by what an earlier run recorded.
        finished = subprocess.run(
            [str(CHECKOUT / ".venv" / "bin" / "pytest"), "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *tiers],
            cwd=CHECKOUT, capture_output=True, text=True,
        )
        seconds = time.monotonic() - started
        if not junit.exists():  # pytest could not even collect: the run failed as a whole
            return {"run": index, "exit_code": finished.returncode, "seconds": round(seconds, 1),
                    "failed": [{"test": "(collection)", "outcome": "error", "report": finished.stdout[-REPORT_CHARS:]}]}
        counts, failed = _failures(junit)
    return {"run": index, "exit_code": finished.returncode, "seconds": round(seconds, 1), **counts, "failed": failed}


def _earlier_runs(path: Path, commit: str) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    recorded = read_result(path)
    if recorded.params.get("commit") != commit:
        sys.exit(f"--append: {path} records commit {recorded.params.get('commit')}, this checkout is {commit}")
    return list(recorded.rows)


def _write(args: argparse.Namespace, commit: str, rows: list[dict[str, Any]]) -> Path:
    green = [row["exit_code"] == 0 for row in rows]
    streak = 0
    for ok in reversed(green):
        if not ok:
            break
        streak += 1
    flaky: dict[str, int] = {}
    for row in rows:
        for failure in row["failed"]:
            flaky[failure["test"]] = flaky.get(failure["test"], 0) + 1
    summary = {"runs": len(rows), "green_runs": sum(green), "green_in_a_row_at_the_end": streak,
               "failures_by_test": dict(sorted(flaky.items(), key=lambda item: -item[1]))}
    params = {**params_of(args, leave_out=("results_dir", "append")), "commit": commit}
    result = new_result("repeated_tiers", params, rows, summary=summary,
                        notes=["a run is green when pytest exits 0 over every tier; seconds include each test's clusters"])
    return write_result(result, output_dir(args))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The last commit that changed what the tiers run: one that only touches docs, benchmarks (results, this
    # script) or the tiers left out (the pods and GPU tests import from e2e, never the other way) leaves runs
    # comparable.
    code = (".", ":!docs", ":!benchmarks", ":!tests/pods", ":!tests/gpu")
    commit = _git("log", "-1", "--format=%H", "--", *code) + ("-dirty" if _git("status", "--porcelain", "--untracked-files=no", "--", *code) else "")
    path = output_dir(args) / "repeated_tiers.json"
    rows = _earlier_runs(path, commit) if args.append else []
    deadline = time.monotonic() + args.hours * 3600
    for index in range(len(rows) + 1, len(rows) + args.runs + 1):
        if time.monotonic() > deadline:
            print(f"{args.hours} h passed: no more runs")
            break
        print(f"run {index}: pytest {' '.join(args.tiers)} ...", flush=True)
        row = run_once(index, args.tiers)
        rows.append(row)
        names = ", ".join(failure["test"] for failure in row["failed"]) or "none"
        print(f"run {index}: exit {row['exit_code']} in {row['seconds']:.0f} s, failed: {names}", flush=True)
        _write(args, commit, rows)
    print_table(rows, ["run", "exit_code", "seconds", "tests", "failures", "errors"])
    print(f"result: {path}")
    return 0 if all(row["exit_code"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
