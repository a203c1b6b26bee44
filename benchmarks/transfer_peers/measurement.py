"""One system's numbers at one batch: GB/s and batch latencies, from the timed batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Measurement:
    """GB/s over the median batch, p50/p99 batch latencies in ms, every latency, and the checksum's verdict."""

    gbps: float
    p50_ms: float
    p99_ms: float
    latencies_ms: list[float]
    verified: bool

    @classmethod
    def of(cls, nbytes: int, latencies_s: Sequence[float], verified: bool) -> Measurement:
        ms = np.asarray(latencies_s) * 1e3
        p50 = float(np.percentile(ms, 50))
        return cls(round(nbytes / (p50 / 1e3) / 1e9, 3), round(p50, 3), round(float(np.percentile(ms, 99)), 3),
                   [round(float(x), 3) for x in ms], verified)  # fmt: skip


def pooled(nbytes: int, measurements: list[Measurement]) -> Measurement:
    """One measurement from every round's timed batches (the median batch of them all)."""
    if len(measurements) == 1:
        return measurements[0]
    latencies = [ms / 1e3 for m in measurements for ms in m.latencies_ms]
    return Measurement.of(nbytes, latencies, all(m.verified for m in measurements))
