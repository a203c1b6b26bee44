"""Bounded polling for tests: wait for a condition instead of sleeping a guessed time and checking once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    what: str | Callable[[], str], condition: Callable[[], Any], timeout: float = 60.0, interval: float = 0.5
) -> Any:
    """Poll until `condition()` is truthy and return it; fail naming `what` after `timeout` seconds.

    `what` may be a function, so that the failure message describes the state at the deadline.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    description = what() if callable(what) else what
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {description}; last value: {last!r}")
