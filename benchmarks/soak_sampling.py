"""What the soak benchmark reads from each process, and how it judges growth. No torch, no cluster: the
unit tests import this alone."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

TASKS_GAUGE = "kvferry:asyncio_tasks"
METRICS = ("rss_mib", "open_fds", "asyncio_tasks")  # judged; threads are recorded too, for the reader
TAIL_SAMPLES = 3  # each end of a run is the mean of this many samples


@dataclass(frozen=True)
class ProcessReading:
    rss_mib: float
    open_fds: int
    threads: int
    asyncio_tasks: int


def proc_usage(pid: int) -> tuple[float, int, int]:
    """(resident set in MiB, open file descriptors, threads) of a live process, from /proc."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    rss_kib = int(fields["VmRSS"].split()[0])
    return rss_kib / 1024, len(os.listdir(f"/proc/{pid}/fd")), int(fields["Threads"])


def gauge_value(exposition: str, name: str) -> float:
    """One gauge's value from a Prometheus text exposition (the first sample of that name)."""
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise KeyError(f"{name} is not in the exposition")


def quietest(readings: list[ProcessReading]) -> ProcessReading:
    """Per metric, the smallest of a few readings taken a moment apart: a leak stays in every reading, while a
    health probe or a heartbeat in flight (a task, a socket) is in only some of them."""
    return ProcessReading(
        *(min(getattr(r, field) for r in readings) for field in ProcessReading.__dataclass_fields__)
    )


def growth(times_s: list[float], values: list[float], warmup_s: float) -> dict[str, float]:
    """Growth of one series: the mean of its last TAIL_SAMPLES samples against the mean of its first
    TAIL_SAMPLES at or after warmup_s (caches, pools and compiled code fill before that). Both ends are means
    because a count such as open descriptors moves by a few between samples (pooled connections to the nodes
    that the nodes closed as idle, and the router notices on its next call); a short series takes half each."""
    after = [value for time_s, value in zip(times_s, values, strict=True) if time_s >= warmup_s]
    if len(after) < 2:
        raise ValueError(f"growth needs two samples after the {warmup_s:g} s warm-up, got {len(after)}")
    window = min(TAIL_SAMPLES, len(after) // 2)
    baseline, final = statistics.fmean(after[:window]), statistics.fmean(after[-window:])
    if baseline <= 0:  # a live server has memory, descriptors and at least the scrape's own task
        raise ValueError(f"a baseline of {baseline} cannot show growth (was the value read at all?)")
    return {
        "baseline": round(baseline, 3),
        "final": round(final, 3),
        "growth_pct": round((final - baseline) / baseline * 100, 2),
    }
