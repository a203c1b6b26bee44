"""The P/D decision: per request, prefill on a prefill node and move the KV (disaggregate), or prefill on
the decode node itself.

What disaggregation saves is the prompt's compute kept out of the decode node's batch, where it would
stall every stream the node is decoding for as long as it runs. What it costs is this request's extra
latency: the reservation, the prefill call and the KV transfer. For a short prompt the cost, mostly
fixed, exceeds the compute it saves; for a long one the compute, which grows faster, wins.

`auto` measures both from the P/D requests it sees (the prefill node reports its compute; the router
times the rest) and disaggregates a prompt when its predicted compute exceeds its predicted cost. Until
it has enough samples it uses a fixed threshold of uncached prompt tokens.

Compute is fitted as c1 t + c2 t^2 (the projections grow with the prompt, attention with its square),
cost as a + b t. The square matters: the samples are the prompts it disaggregated, long ones, and a
per-token average of them (the first rule tried) overstated a short prompt's compute several times:
measured on two CPU cores, 66 us a token at 512 tokens against 350 us at 4096, and its crossover fell to
28 tokens, below the 32-token prompts it should have kept (benchmarks/pd_decision.py). `always` and `never` are the
fixed policies it is compared against (benchmarks/pd_decision.py).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import Literal

Mode = Literal["always", "auto", "never"]
MIN_SAMPLES = 8  # P/D requests measured before the measured rule replaces the threshold
WINDOW = 256  # the most recent samples the rule is fitted to (the load and the nodes change)


@dataclass(frozen=True)
class PDSample:
    tokens: int  # uncached prompt tokens the prefill node computed and sent
    compute_seconds: float  # the prefill node's compute for them (its queue left out)
    overhead_seconds: float  # what the P/D path added: reservation, prefill call and transfer, less compute and queue


class PDDecision:
    def __init__(self, mode: Mode = "always", min_tokens: int = 256) -> None:
        self.mode, self.min_tokens = mode, min_tokens
        self._samples: deque[PDSample] = deque(maxlen=WINDOW)
        self._lock = threading.Lock()

    def disaggregate(self, uncached_tokens: int) -> bool:
        if self.mode != "auto":
            return self.mode == "always"
        threshold = self.threshold()
        return threshold is not None and uncached_tokens >= threshold

    def observe(self, sample: PDSample) -> None:
        with self._lock:
            self._samples.append(sample)

    def threshold(self) -> int | None:
        """The fewest uncached tokens worth disaggregating (auto): where the predicted compute overtakes the
        predicted cost. None: never (moving a token costs more than computing it, at any length)."""
        with self._lock:
            samples = list(self._samples)
        if len(samples) < MIN_SAMPLES:
            return self.min_tokens
        linear, square = _compute_curve([(s.tokens, s.compute_seconds) for s in samples])
        fixed, per_token = _line([(s.tokens, s.overhead_seconds) for s in samples])
        # compute(t) >= cost(t)  <=>  square t^2 + (linear - per_token) t - fixed >= 0: its positive root.
        slope = linear - per_token
        if square > 0:
            return max(1, round((-slope + math.sqrt(slope * slope + 4 * square * fixed)) / (2 * square)))
        if slope <= 0:
            return None
        return max(1, round(fixed / slope))

    def stats(self) -> dict[str, object]:
        return {"mode": self.mode, "threshold_tokens": self.threshold() if self.mode == "auto" else None,
                "samples": len(self._samples)}


def _compute_curve(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares y = c1 x + c2 x^2 (no constant: no tokens, no compute), both kept >= 0."""
    s2 = sum(x**2 for x, _ in points)
    s3 = sum(x**3 for x, _ in points)
    s4 = sum(x**4 for x, _ in points)
    y1 = sum(y * x for x, y in points)
    y2 = sum(y * x**2 for x, y in points)
    det = s2 * s4 - s3 * s3
    if det > 1e-9 * s2 * s4:  # samples of more than one length: both terms are determined
        linear, square = (y1 * s4 - y2 * s3) / det, (s2 * y2 - s3 * y1) / det
        if linear >= 0 and square >= 0:
            return linear, square
        if linear < 0:  # all curvature: the best square alone
            return 0.0, max(0.0, y2 / s4)
    return max(0.0, y1 / s2) if s2 else 0.0, 0.0


def _line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares y = a + b x, both kept >= 0 (a cost is neither negative nor shrinking with size)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in points) / spread) if spread else 0.0
    return max(0.0, mean_y - slope * mean_x), slope
