"""Passive and active health: a node that fails (a probe, or a call the router made) is ejected, then
probed again after a backoff that doubles with each failure in a row; one success re-admits it. A node
that has never answered is starting (a router often starts before its nodes): it is probed again after
the first backoff each time, so it joins as soon as it is up."""

from __future__ import annotations

import time
from dataclasses import dataclass

FIRST_BACKOFF_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0


@dataclass
class _State:
    failures: int = 0
    retry_at: float = 0.0


class HealthTracker:
    def __init__(self, first_backoff: float = FIRST_BACKOFF_SECONDS, max_backoff: float = MAX_BACKOFF_SECONDS) -> None:
        self.first_backoff, self.max_backoff = first_backoff, max_backoff
        self._states: dict[str, _State] = {}
        self._ever_healthy: set[str] = set()

    def is_healthy(self, url: str) -> bool:
        return self._states.get(url, _State()).failures == 0

    def due_for_probe(self, url: str, now: float | None = None) -> bool:
        """Healthy nodes are probed every round; ejected ones once their backoff has passed."""
        state = self._states.get(url)
        return state is None or state.failures == 0 or (now if now is not None else time.monotonic()) >= state.retry_at

    def record_success(self, url: str) -> None:
        self._states.pop(url, None)
        self._ever_healthy.add(url)

    def record_failure(self, url: str, now: float | None = None) -> None:
        now = now if now is not None else time.monotonic()
        state = self._states.setdefault(url, _State())
        if state.failures and now < state.retry_at:
            # Already ejected, not yet probed again: calls that were in flight when the node died (each of its
            # streams) fail together, and are one failure, not one doubling of the backoff each.
            return
        state.failures += 1
        doublings = state.failures - 1 if url in self._ever_healthy else 0
        backoff = min(self.max_backoff, self.first_backoff * 2**doublings)
        state.retry_at = now + backoff

    def forget_except(self, urls: set[str]) -> None:
        for url in set(self._states) - urls:
            del self._states[url]
        self._ever_healthy &= urls
