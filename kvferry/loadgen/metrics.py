"""From request records to the numbers serving papers report: latency percentiles, throughput, goodput."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvferry.loadgen.client import RequestRecord

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None

    def met_by(self, record: RequestRecord) -> bool:
        """A failed request never meets it; a one-token answer has no TPOT and passes that half."""
        if record.error is not None or record.ttft_s is None:
            return False
        if self.ttft_s is not None and record.ttft_s > self.ttft_s:
            return False
        tpot = record.tpot_s
        return self.tpot_s is None or tpot is None or tpot <= self.tpot_s


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and p50/p90/p99 (linear interpolation between samples); None for an empty sample."""
    if not values:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    array = np.asarray(values, dtype=float)
    return {"mean": float(array.mean()), **{f"p{p}": float(np.percentile(array, p)) for p in PERCENTILES}}


def summarize(records: Sequence[RequestRecord], duration_s: float, slo: Slo) -> dict[str, object]:
    completed = [r for r in records if r.error is None]
    good = sum(1 for r in records if slo.met_by(r))
    output_tokens = sum(r.output_tokens for r in completed)
    per_second = 1.0 / duration_s if duration_s > 0 else 0.0
    return {
        "requests": len(records),
        "completed": len(completed),
        "failed": len(records) - len(completed),
        "duration_s": duration_s,
        "request_throughput_rps": len(completed) * per_second,
        "output_tok_s": output_tokens * per_second,
        "input_tok_s": sum(r.input_tokens for r in completed) * per_second,
        "goodput_rps": good * per_second,
        "slo_attainment": good / len(records) if records else 0.0,
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "ttft_s": distribution([r.ttft_s for r in completed if r.ttft_s is not None]),
        "tpot_s": distribution([t for r in completed if (t := r.tpot_s) is not None]),
        "itl_s": distribution([gap for r in completed for gap in r.itl_s]),
        "e2e_s": distribution([r.latency_s for r in completed]),
        "errors": sorted({r.error for r in records if r.error is not None})[:5],
    }
