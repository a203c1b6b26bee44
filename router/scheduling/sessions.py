"""Session affinity: where each conversation's last turn went. A conversation's next prompt starts with
everything before it, whose KV is on the nodes that served that turn: the prefill node holds the prompt's
blocks, the decode node those and the answer's, which no prefill node has (the decode node computed them). The
`session` scorer prefers those nodes while they are not overloaded. A session is named by the request's
`prompt_cache_key` (the Responses API sets one per conversation), else its `user`; this router remembers it
for `ttl_seconds` after its last turn."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

DEFAULT_MAX_SESSIONS = 100_000  # oldest forgotten first


class SessionAffinity:
    def __init__(self, ttl_seconds: float, max_sessions: int = DEFAULT_MAX_SESSIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_seconds, self.max_sessions, self.clock = ttl_seconds, max_sessions, clock
        self._last: OrderedDict[str, tuple[float, frozenset[str]]] = OrderedDict()  # key -> (expiry, node names)

    def nodes(self, key: str | None) -> frozenset[str]:
        """The nodes of the session's last turn (none for a new or forgotten session)."""
        entry = self._last.get(key) if key is not None else None
        if entry is None or entry[0] <= self.clock():
            return frozenset()
        return entry[1]

    def record(self, key: str | None, nodes: frozenset[str]) -> None:
        if key is None or self.ttl_seconds <= 0:
            return
        self._last[key] = (self.clock() + self.ttl_seconds, nodes)
        self._last.move_to_end(key)
        while len(self._last) > self.max_sessions:
            self._last.popitem(last=False)
