"""A write requested before its data exists (TransferEngine.prepare_write): the handle its caller keeps.

The decode side's lease is open before the prefill starts, so the write can be requested then: the target
checks it and readies its memory while the prefill computes, and once the KV exists `send` starts the data
at once. The request, the target's wake and its checks leave the critical path (docs/transfer.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future

import numpy as np


class PreparedWrite:
    def __init__(self, future: Future[int], ranges: int, send: Callable[[np.ndarray], None],
                 withdraw: Callable[[], None]) -> None:  # fmt: skip
        self.future = future  # the write's outcome, as batch_transfer_write_async's
        self.ranges = ranges  # destination ranges prepared; send takes a source address for each
        self._send = send
        self._withdraw = withdraw
        self.outcome: str | None = None  # "sent" or "withdrawn", once

    def send(self, src_addrs: Sequence[int]) -> Future[int]:
        """Start the data: one source address per destination range prepared, of its length. Once."""
        if len(src_addrs) != self.ranges:
            raise ValueError(f"{len(src_addrs)} source addresses for the {self.ranges} ranges prepared")
        self._take("sent")
        self._send(np.asarray(src_addrs, dtype=np.int64))
        return self.future

    def withdraw(self) -> None:
        """Give the write up before sending (the source does not fit the ranges prepared, or the prefill
        failed): the target ends it without failing the lease behind it. Once, instead of send."""
        self._take("withdrawn")
        self._withdraw()

    def _take(self, outcome: str) -> None:
        if self.outcome is not None:
            raise RuntimeError(f"a prepared write is sent or withdrawn once (this one was {self.outcome})")
        self.outcome = outcome
