"""The admission limit: at most `limit` requests in flight in this router; the next one gets 429."""

from __future__ import annotations

from kvferry.router.api.errors import overloaded


class Admission:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.inflight = 0

    def enter(self) -> None:
        if self.inflight >= self.limit:
            raise overloaded(429, f"the router has {self.inflight} requests in flight (limit {self.limit}); retry later")
        self.inflight += 1

    def leave(self) -> None:
        self.inflight -= 1
