"""The one result format of the suite: every file under benchmarks/results/ is a BenchmarkResult."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

VARIANT = "variant"  # the row key naming the engine, setup or policy a row measured


class BenchmarkResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    benchmark: str  # the module under benchmarks/ that measures it: `python -m benchmarks.<benchmark>`
    created: datetime  # UTC
    command: list[str]  # the argv that produced it; empty where it was not recorded
    environment: dict[str, Any]  # python, torch, CPU threads, machine, GPU, and what a benchmark adds
    params: dict[str, Any]  # the benchmark's knobs for this run
    rows: list[dict[str, Any]]  # one per measured configuration
    baseline: str | None = None  # the variant the rows' ratios are against
    summary: dict[str, Any] = {}  # measurements that are not one configuration's: ratios, samples, ceilings
    notes: list[str] = []  # what a reader needs to know to read the numbers

    @field_validator("created")
    @classmethod
    def _in_utc(cls, created: datetime) -> datetime:
        if created.utcoffset() != timedelta(0):
            raise ValueError(f"created must be a UTC time, got {created.isoformat()}")
        return created.astimezone(UTC)

    @model_validator(mode="after")
    def _baseline_is_a_measured_variant(self) -> BenchmarkResult:
        if self.baseline is None:
            return self
        unnamed = [index for index, row in enumerate(self.rows) if VARIANT not in row]
        if unnamed:
            raise ValueError(f"baseline {self.baseline!r} set but rows {unnamed} name no {VARIANT}")
        if self.baseline not in {row[VARIANT] for row in self.rows}:
            raise ValueError(f"baseline {self.baseline!r} is not the {VARIANT} of any row")
        return self
