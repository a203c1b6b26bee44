"""A run's summary as a table on stdout and as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from kvferry.loadgen.metrics import PERCENTILES, Slo, summarize
from kvferry.loadgen.runner import RunResult

LATENCIES = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s"))


def run_summary(result: RunResult, slo: Slo) -> dict[str, object]:
    return {"load": asdict(result.shape), **summarize(result.records, result.duration_s, slo)}


def format_summary(summary: dict[str, object], label: str) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.1f}"

    lines = [
        f"== {label} ==",
        f"requests {summary['completed']}/{summary['requests']} completed in {summary['duration_s']:.2f} s",
        f"request throughput {summary['request_throughput_rps']:.2f}/s, output {summary['output_tok_s']:.1f} tok/s, "
        f"goodput {summary['goodput_rps']:.2f}/s ({summary['slo_attainment']:.0%} within the SLO)",
        f"{'ms':<6}" + "".join(f"{name:>10}" for name in ("mean", *(f"p{p}" for p in PERCENTILES))),
    ]
    for name, key in LATENCIES:
        stats = summary[key]
        lines.append(f"{name:<6}" + "".join(f"{ms(stats[k]):>10}" for k in ("mean", *(f"p{p}" for p in PERCENTILES))))
    if summary["errors"]:
        lines.append(f"errors: {summary['errors']}")
    return "\n".join(lines)


def per_request_rows(result: RunResult) -> list[dict[str, object]]:
    return [
        {"start_s": r.start_s, "input_tokens": r.input_tokens, "output_tokens": r.output_tokens, "ttft_s": r.ttft_s,
         "tpot_s": r.tpot_s, "e2e_s": r.latency_s, "error": r.error}
        for r in result.records
    ]


def write_json(path: Path, config: dict[str, object], results: list[RunResult], slo: Slo) -> None:
    runs = [{"summary": run_summary(result, slo), "requests": per_request_rows(result)} for result in results]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"config": config, "runs": runs}, indent=2) + "\n")
