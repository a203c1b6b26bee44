"""The next interval's load from the last few: a load that rose in every one of them is expected to rise
once more by its mean rise; any other load is expected to stay where it is.

A climbing load is met one interval early instead of one late, which is what a node's start-up time needs.
A step up is already in the last sample and is not extrapolated (a smoothed trend would carry a step on
and over-provision for several intervals); a falling load is not anticipated, so a scale-down waits for
the load itself.
"""

from __future__ import annotations

from dataclasses import dataclass

RISES_FOR_A_TREND = 3  # consecutive rises that make a trend


@dataclass(frozen=True)
class LoadForecast:
    recent: tuple[float, ...]  # the last RISES_FOR_A_TREND + 1 loads, oldest first

    @classmethod
    def first(cls, load: float) -> LoadForecast:
        return cls((load,))

    def updated(self, load: float) -> LoadForecast:
        return LoadForecast((*self.recent, load)[-(RISES_FOR_A_TREND + 1):])

    def next_interval(self) -> float:
        rises = [b - a for a, b in zip(self.recent, self.recent[1:], strict=False)]
        last = self.recent[-1]
        if len(rises) == RISES_FOR_A_TREND and all(rise > 0 for rise in rises):
            return last + sum(rises) / len(rises)
        return last
