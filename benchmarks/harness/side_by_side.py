"""Several variants measured in one run, side by side, and ratios against a baseline variant."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmarks.harness.schema import VARIANT

Measurement = dict[str, Any]


def side_by_side(
    variants: Mapping[str, Callable[[], Measurement]], rounds: int = 1
) -> dict[str, list[Measurement]]:
    """Each variant measured once per round, in the given order on even rounds and reversed on odd ones
    (ABBA): drift in the machine's other load then falls on every variant alike. Each variant's
    measurements, round by round."""
    measured: dict[str, list[Measurement]] = {name: [] for name in variants}
    for number in range(rounds):
        order = list(variants) if number % 2 == 0 else list(reversed(variants))
        for name in order:
            measured[name].append(variants[name]())
    return measured


def with_ratios(
    rows: Sequence[Measurement], baseline: str, metrics: Sequence[str], group_by: Sequence[str] = ()
) -> list[Measurement]:
    """Each row with `<metric>_vs_baseline` added: its metric over the baseline variant's row with the same
    `group_by` values (None where either is missing or the baseline's is 0)."""

    def group(row: Measurement) -> tuple[object, ...]:
        return tuple(row.get(key) for key in group_by)

    bases = {group(row): row for row in rows if row[VARIANT] == baseline}
    result = []
    for row in rows:
        base = bases.get(group(row), {})
        ratios = {}
        for metric in metrics:
            value, reference = row.get(metric), base.get(metric)
            ratios[f"{metric}_vs_baseline"] = (
                round(value / reference, 3) if value is not None and reference else None
            )
        result.append({**row, **ratios})
    return result
