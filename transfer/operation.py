"""One operation in flight (a write, a read or a hello, on either side): the UCX requests it waits on,
the buffers they use, and how it ends."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kvferry.transfer import ucp_direct
from kvferry.transfer.errors import TransferError
from kvferry.transfer.ucx import Request, request_error


@dataclass(eq=False)
class Operation:
    """`requests` are polled, `keep` holds buffers UCX still reads or writes. An operation this engine
    started may carry a `step` (run each turn before the common checks; True when it handled the turn)
    and an `on_expiry` (run once it timed out): a write's puts and its abort message live there."""

    peer: str
    kind: str
    deadline: float
    future: Future[int] | None = None
    requests: list[Request] = field(default_factory=list)
    keep: list[object] = field(default_factory=list)
    state: str = "requested"
    data: dict[str, Any] = field(default_factory=dict)
    checked: int = 0  # requests[:checked] completed without error
    payload_bytes: int = 0  # what a write moves: counted as sent once it is confirmed
    step: Callable[[int, Operation, BaseException | None], bool] | None = None
    on_expiry: Callable[[int, Operation], None] | None = None

    def scan(self) -> BaseException | None:
        """Advance over completed requests in order; returns the first error met. Scanning resumes where
        it stopped, so a batch of n messages costs O(n) over its life, not O(n) per loop turn."""
        while self.checked < len(self.requests) and self.requests[self.checked].completed:
            error = request_error(self.requests[self.checked])
            if error is not None:
                return error
            self.checked += 1
        return None

    @property
    def all_completed(self) -> bool:
        return self.checked == len(self.requests)


def cancel(op: Operation) -> None:
    """Withdraw scatter-gather requests still posted (ucxx's own are cancelled with their endpoint)."""
    for request in op.requests[op.checked :]:
        if isinstance(request, ucp_direct.UcpRequest):
            request.cancel()


def fail(op: Operation, error: TransferError) -> None:
    if op.future is not None and not op.future.done():
        op.future.set_exception(error)
