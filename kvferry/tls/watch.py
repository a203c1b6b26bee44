"""Whether files changed: how a server sees that a mounted Secret was rotated.

By content, not by time stamp: the kubelet swaps a Secret volume's files by moving a symlink, and a digest
of what the files hold is the same test for that, for a file rewritten in place, and for a copy."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)


def _digest(paths: Sequence[str]) -> bytes | None:
    digest = hashlib.sha256()
    try:
        for path in paths:
            with open(path, "rb") as file:
                digest.update(file.read())
    except OSError:  # mid-swap, or removed: the last good files stay in use
        return None
    return digest.digest()


class FileWatch:
    """Calls `reload` when the files' contents differ from what it last loaded."""

    def __init__(self, paths: Sequence[str], reload: Callable[[], None]) -> None:
        self.paths, self.reload = tuple(paths), reload
        self._loaded = _digest(self.paths)

    def check(self) -> bool:
        """Reload if the files changed; whether a reload happened. A reload that fails (a certificate and a
        key that do not match yet) leaves the old ones in use and is tried again at the next check."""
        now = _digest(self.paths)
        if now is None or now == self._loaded:
            return False
        try:
            self.reload()
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            log.warning("could not reload %s: %s; keeping the ones in use", ", ".join(self.paths), exc)
            return False
        self._loaded = now
        log.info("reloaded %s", ", ".join(self.paths))
        return True

    async def check_every(self, seconds: float) -> None:
        """`check` every `seconds`, on the event loop (an SSLContext is not to be changed from another thread),
        until cancelled."""
        while True:
            await asyncio.sleep(seconds)
            self.check()
