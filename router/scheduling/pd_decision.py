"""The P/D decision: per request, prefill on a prefill node and move the KV (disaggregate), or prefill on
the decode node itself.

What disaggregation saves is the prompt's compute kept out of the decode node's batch, where it would
stall every stream the node is decoding for as long as it runs. What it costs is this request's extra
latency: the reservation, the prefill call and the KV transfer. For a short prompt the cost, mostly
fixed, exceeds the compute it saves; for a long one the compute, which grows faster, wins.

`auto` measures both from the P/D requests it sees (the prefill node reports its compute; the router
times the rest) and disaggregates a prompt when its predicted compute exceeds its predicted cost. Until
it has enough samples it uses a fixed threshold of uncached prompt tokens. `always` and `never` are the
fixed policies it is compared against (benchmarks/pd_decision.py).
"""

from __future__ import annotations

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
        """The fewest uncached tokens worth disaggregating (auto): where the predicted compute, proportional
        to the tokens, overtakes the predicted cost, a fixed part plus a part per token. None: never (the
        transfer costs more per token than the compute it saves)."""
        with self._lock:
            samples = list(self._samples)
        if len(samples) < MIN_SAMPLES:
            return self.min_tokens
        compute_per_token = sum(s.compute_seconds for s in samples) / max(1, sum(s.tokens for s in samples))
        fixed, per_token = _line([(s.tokens, s.overhead_seconds) for s in samples])
        if compute_per_token <= per_token:
            return None
        return max(1, round(fixed / (compute_per_token - per_token)))

    def stats(self) -> dict[str, object]:
        return {"mode": self.mode, "threshold_tokens": self.threshold() if self.mode == "auto" else None,
                "samples": len(self._samples)}


def _line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares y = a + b x, both kept >= 0 (a cost is neither negative nor shrinking with size)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in points) / spread) if spread else 0.0
    return max(0.0, mean_y - slope * mean_x), slope
