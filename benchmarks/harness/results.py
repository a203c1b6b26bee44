"""Making a result and writing it where results go: benchmarks/results/, or the folder asked for."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.harness.environment import environment as machine_environment
from benchmarks.harness.schema import BenchmarkResult

RESULTS = Path(__file__).resolve().parents[1] / "results"
RESULTS_ENV = "KVFERRY_BENCH_RESULTS"  # a folder that takes the place of benchmarks/results/
# A smoke run's numbers say nothing about the machine; they go here unless a folder is asked for, so that
# they never replace a recorded result.
QUICK_RESULTS = Path(tempfile.gettempdir()) / "kvferry-bench-quick"


def results_dir(explicit: Path | None = None, quick: bool = False) -> Path:
    """The folder a result goes to: the one asked for, else $KVFERRY_BENCH_RESULTS, else the quick
    folder for a smoke run, else benchmarks/results/."""
    if explicit is not None:
        return explicit
    if os.environ.get(RESULTS_ENV):
        return Path(os.environ[RESULTS_ENV])
    return QUICK_RESULTS if quick else RESULTS


def params_of(args: argparse.Namespace, leave_out: Sequence[str] = ("results_dir",)) -> dict[str, Any]:
    """A run's knobs from its parsed arguments, as JSON values (paths and other objects as text)."""
    return {
        key: json.loads(json.dumps(value, default=str))
        for key, value in vars(args).items()
        if key not in leave_out
    }


def new_result(
    benchmark: str,
    params: dict[str, Any],
    rows: list[dict[str, Any]],
    *,
    baseline: str | None = None,
    summary: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
    environment: dict[str, Any] | None = None,
) -> BenchmarkResult:
    """This run's result: now, this process's argv, and `environment` (default: this machine's facts)."""
    return BenchmarkResult(
        benchmark=benchmark,
        created=datetime.now(UTC),
        command=[Path(sys.argv[0]).name, *sys.argv[1:]],
        environment=machine_environment() if environment is None else environment,
        params=params,
        rows=rows,
        baseline=baseline,
        summary=summary or {},
        notes=list(notes),
    )


def write_result(result: BenchmarkResult, directory: Path, name: str | None = None) -> Path:
    """Validated (again: a caller may have built it from a dict) and written to DIRECTORY/NAME.json;
    NAME is the benchmark's unless given (one benchmark may keep several results, e.g. per device layout)."""
    checked = BenchmarkResult.model_validate(result.model_dump())
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name or checked.benchmark}.json"
    path.write_text(json.dumps(checked.model_dump(mode="json"), indent=2) + "\n")
    return path


def read_result(path: Path) -> BenchmarkResult:
    return BenchmarkResult.model_validate_json(path.read_text())
