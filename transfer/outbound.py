"""The operations this engine started (writes, reads, hellos), by id: replies find theirs here, and every
turn of the loop settles each one (done, failed with its peer, or past its deadline)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from kvferry.transfer import protocol
from kvferry.transfer.errors import PeerUnreachableError, TransferError, TransferTimeoutError
from kvferry.transfer.operation import Operation, cancel, fail
from kvferry.transfer.peers import Peers

# The state in which each kind is over once its requests completed: a write once the target confirmed,
# a read once its receives completed, a hello once acknowledged.
FINAL_STATES = {"write": "confirmed", "read": "requested", "hello": "acked"}


class OutboundOps:
    def __init__(self, peers: Peers, stats: dict[str, int]) -> None:
        self._peers = peers
        self._stats = stats
        self._ops: dict[int, Operation] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._ops)

    def new_id(self) -> int:
        return next(self._ids)

    def start(self, key: int, op: Operation, action: Callable[[], None]) -> None:
        """Track `op` under `key` and run its first action (its first message)."""
        self._ops[key] = op
        self.guard(key, op, action)

    def guard(self, key: int, op: Operation, action: Callable[[], None]) -> None:
        """Run a step of `op`; a transfer error (an unknown or unreachable peer) ends it with that error."""
        try:
            action()
        except TransferError as exc:
            self._ops.pop(key, None)
            fail(op, exc)

    def get(self, key: int) -> Operation | None:
        return self._ops.get(key)

    def pop(self, key: int) -> None:
        self._ops.pop(key, None)

    def expect(self, message: protocol.ControlMessage, kind: str, state: str) -> Operation | None:
        """The operation a reply is for, if it is in the state that reply may come in; else None.
        Late, repeated or forged replies are counted and ignored."""
        op = self._ops.get(message["op"])
        if op is None or op.kind != kind or op.peer != message["sender"] or op.state != state:
            self._stats["duplicate_messages"] += 1
            return None
        return op

    def poll(self, now: float) -> None:
        for key, op in list(self._ops.items()):
            self._settle(key, op, now)

    def busy(self) -> bool:
        """Requests of these operations are in flight (they move only while the loop thread progresses)."""
        return any(not op.all_completed for op in self._ops.values())

    def fail_all(self, error: TransferError) -> None:
        for op in list(self._ops.values()):
            fail(op, error)

    def _settle(self, key: int, op: Operation, now: float) -> None:
        error = op.scan()
        if op.step is not None and op.step(key, op, error):
            return
        if error is not None:
            self._ops.pop(key, None)
            cancel(op)
            self._peers.drop(op.peer)
            fail(op, PeerUnreachableError(f"{op.kind} with {op.peer} failed: {error}"))
            return
        if op.all_completed and op.state == FINAL_STATES[op.kind]:
            self._ops.pop(key, None)
            self._stats["bytes_sent"] += op.payload_bytes
            if op.future is not None and not op.future.done():
                op.future.set_result(0)
        elif now > op.deadline:
            self._ops.pop(key, None)
            cancel(op)
            self._peers.drop(op.peer)
            fail(op, TransferTimeoutError(f"{op.kind} with {op.peer} did not finish in time (state {op.state})"))
            if op.on_expiry is not None:
                op.on_expiry(key, op)
