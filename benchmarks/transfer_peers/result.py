"""The benchmark's working payload as a suite result, and back (a run of one part adds its numbers to the
other part's from the results file)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.harness.environment import environment
from benchmarks.harness.results import new_result, write_result
from benchmarks.harness.schema import BenchmarkResult


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
    """The result written to --output (the path written), or nothing under --no-write."""
    if args.no_write:
        return None
    return write_result(result_of(payload), args.output.parent, args.output.stem)
