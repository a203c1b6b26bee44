"""A write requested before its data exists (TransferEngine.prepare_write): the handle its caller keeps.

The decode side's lease is open before the prefill starts, so the write can be requested then: the target
checks it and readies its memory while the prefill computes, and once the KV exists `send` starts the data
at once. The request, the target's wake and its checks leave the critical path (docs/transfer.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future

import numpy as np

from kvferry.transfer.batch import batch_columns

Sender = Callable[[np.ndarray, np.ndarray | None, np.ndarray | None], None]


class PreparedWrite:
    def __init__(self, future: Future[int], ranges: int, send: Sender, withdraw: Callable[[], None]) -> None:
        self.future = future  # the write's outcome, as batch_transfer_write_async's
        self.ranges = ranges  # destination ranges prepared; send takes a source address for each
        self._send = send
        self._withdraw = withdraw
        self.outcome: str | None = None  # "sent" or "withdrawn", once
        # Once the target accepted the write: True where its data goes as puts (host memory), which take
        # any ranges that tile the ones prepared; False where as tagged messages, which take those alone.
        self.puts: bool | None = None

    def mark_ready(self, puts: bool) -> None:
        """The engine's loop, when the target accepted the write."""
        self.puts = puts

    def send(self, src_addrs: Sequence[int], dst_addrs: Sequence[int] | None = None,
             lengths: Sequence[int] | None = None) -> Future[int]:  # fmt: skip
        """Start the data, once: one source address per destination range prepared, of its length; or, where
        `puts` is True, (source, destination, length) ranges that cover the ranges prepared exactly."""
        if dst_addrs is None or lengths is None:
            if len(src_addrs) != self.ranges:
                raise ValueError(f"{len(src_addrs)} source addresses for the {self.ranges} ranges prepared")
            columns = (np.asarray(src_addrs, dtype=np.int64), None, None)
        else:
            if not self.puts:
                raise ValueError("only a write whose target takes puts takes other ranges than those prepared")
            columns = batch_columns(src_addrs, dst_addrs, lengths)
        self._take("sent")
        self._send(*columns)
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
