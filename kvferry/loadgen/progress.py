"""A one-line progress bar on stderr, redrawn at most ten times a second."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from kvferry.loadgen.client import RequestRecord

WIDTH = 30
REDRAW_SECONDS = 0.1


class ProgressBar:
    def __init__(self, total: int, label: str, stream: TextIO = sys.stderr, enabled: bool = True) -> None:
        self.total, self.label, self.stream, self.enabled = total, label, stream, enabled
        self.done = self.failed = 0
        self.started = time.monotonic()
        self.drawn = 0.0

    def __call__(self, record: RequestRecord) -> None:
        self.done += 1
        self.failed += record.error is not None
        if time.monotonic() - self.drawn >= REDRAW_SECONDS or self.done == self.total:
            self.draw()

    def draw(self) -> None:
        if not self.enabled:
            return
        self.drawn = time.monotonic()
        filled = WIDTH * self.done // max(1, self.total)
        bar = "#" * filled + "." * (WIDTH - filled)
        elapsed = self.drawn - self.started
        self.stream.write(f"\r{self.label}: [{bar}] {self.done}/{self.total}, {self.failed} failed, {elapsed:.1f} s")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.draw()
            self.stream.write("\n")
            self.stream.flush()
