"""The target's side: writes into this engine's memory and reads from it, which peers started.

A write is checked against registered memory and the write guard (the KV connector's leases) before it is
accepted; host to host, the writer then puts straight into this memory and says complete, else the data
comes as tagged messages into receives posted here. Either way the write ends with done to the writer and
one call of the listener, or, failed, expired or abandoned by its writer, with a call that says so; a
prepared write its writer withdrew before sending data ends with no call (its lease stays open). An eager
write's messages (writes.py) are on their way before it is checked: refused, they are drained, each into a
receive too short for it, which UCX completes as truncated without moving the data and which releases the
writer's send.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kvferry.transfer import protocol
from kvferry.transfer.config import TransferConfig
from kvferry.transfer.control import ControlChannel
from kvferry.transfer.data_messages import DataMessages
from kvferry.transfer.memory import MemoryRegistry
from kvferry.transfer.operation import Operation, cancel
from kvferry.transfer.peers import Peers

log = logging.getLogger(__name__)

# (token, [(address, length), ...]) -> None to accept the write, or the reason to refuse it.
WriteGuard = Callable[[str | None, list[tuple[int, int]]], str | None]
# Told (token, ranges, ok) when a write into this engine's memory completed or failed.
WriteListener = Callable[[str | None, list[tuple[int, int]], bool], None]


class Inbound:
    def __init__(
        self, control: ControlChannel, peers: Peers, data: DataMessages, memory: MemoryRegistry, config: TransferConfig,
        stats: dict[str, int], guard: WriteGuard, listener: WriteListener,
    ) -> None:
        self._control = control
        self._peers = peers
        self._data = data
        self._memory = memory
        self._timeout_seconds = config.timeout_seconds
        self._prepared_hold_seconds = config.prepared_hold_seconds
        self._stats = stats
        self._guard = guard
        self._listener = listener
        self._ops: dict[tuple[str, int], Operation] = {}
        # refused eager writes' messages, until drained or past the deadline; withdrawn writes' cancelled receives
        self._drains: list[Operation] = []

    def __len__(self) -> int:
        return len(self._ops) + len(self._drains)

    def busy(self) -> bool:
        """Receives of ours may be taking data: the loop then polls. A prepared write's receives wait posted
        through its writer's prefill with the loop asleep in epoll, until write_data says the data follows."""
        return any(not op.all_completed and op.data.get("data_coming", True) for op in self._ops.values()) or bool(self._drains)

    def on_write(self, message: protocol.ControlMessage) -> None:
        sender, op_id = message["sender"], message["op"]
        if (sender, op_id) in self._ops:
            self._stats["duplicate_messages"] += 1
            return
        ranges, (addresses, lengths) = message["ranges"], message["range_columns"]
        regions, outside = self._memory.locate(addresses, lengths)
        reason = self._refusal(message["token"], ranges, outside)
        address = bytes.fromhex(message["address"])
        eager = message.fields.get("eager", False)
        if reason is not None:
            self._stats["rejected_writes"] += 1
            self._peers.endpoint(sender, address)
            if eager:
                self._drain(sender, ranges, message["tag_base"])
            self._control.send(sender, None, "write_reject", op=op_id, reason=reason)
            return
        # Held no longer than the writer waits: once it gave up (and said so to its caller) the write
        # must not complete here, even if this process was stopped and is only now catching up.
        # A prepared write's data comes once the writer has it (a prefill's KV): held longer, but bounded too.
        longest = self._prepared_hold_seconds if message.fields.get("prepared", False) else self._timeout_seconds
        hold = max(0.0, min(longest, message["timeout"]))
        op = Operation(sender, "inbound_write", time.monotonic() + hold)
        op.data = {"token": message["token"], "ranges": ranges, "bytes": int(lengths.sum())}
        endpoint = self._peers.endpoint(sender, address)
        if message["iov"] and not any(region.cuda for region in regions):
            # Host to host: the writer puts every range (RMA) into this memory; its write_complete,
            # sent once its flush completed, ends the write.
            rkeys = {region.address: region.rkey.hex() for region in regions}
            op.data.update(rma=True, writer_done=False)
            self._ops[(sender, op_id)] = op
            self._control.send(sender, None, "write_ready", op=op_id, iov=True, rkeys=[[a, k] for a, k in rkeys.items()])
            return
        prepared = message.fields.get("prepared", False)
        if prepared:  # may be withdrawn: receives cancellable one by one, the endpoint left alone
            self._data.receive_cancellable(op, ranges, message["tag_base"])
        else:
            self._data.receive(op, endpoint, ranges, message["tag_base"], False)
        op.data["data_coming"] = not prepared
        self._ops[(sender, op_id)] = op
        if not eager:
            self._control.send(sender, None, "write_ready", op=op_id, iov=False, rkeys=[])

    def _drain(self, sender: str, ranges: list[tuple[int, int]], tag_base: int) -> None:
        op = Operation(sender, "drain", time.monotonic() + self._timeout_seconds)
        self._data.drain(op, ranges, tag_base)
        self._drains.append(op)

    def on_write_complete(self, message: protocol.ControlMessage) -> None:
        op = self._ops.get((message["sender"], message["op"]))
        if op is None or not op.data.get("rma") or op.data["writer_done"]:
            self._stats["duplicate_messages"] += 1
            return
        op.data["writer_done"] = True  # every put landed before the writer sent this; poll() ends it

    def on_write_abort(self, message: protocol.ControlMessage) -> None:
        key = (message["sender"], message["op"])
        op = self._ops.get(key)
        if op is None or op.kind != "inbound_write":
            self._stats["duplicate_messages"] += 1
            return
        log.warning("%s abandoned write %s: %s", key[0], key[1], message["reason"])
        self._stats["aborted_writes"] += 1
        self._end(key, op)

    def on_write_data(self, message: protocol.ControlMessage) -> None:
        op = self._ops.get((message["sender"], message["op"]))
        if op is None or op.kind != "inbound_write" or op.data.get("data_coming", True):
            self._stats["duplicate_messages"] += 1
            return
        op.data["data_coming"] = True

    def on_write_withdraw(self, message: protocol.ControlMessage) -> None:
        key = (message["sender"], message["op"])
        op = self._ops.get(key)
        if op is None or op.kind != "inbound_write":
            self._stats["duplicate_messages"] += 1  # refused, or ended already
            return
        self._stats["withdrawn_writes"] += 1
        # Its receives are cancelled, and polled until UCX has ended them, as a refused write's drain is; the
        # endpoint stays, since the writer's next write (an ordinary one, as a rule) follows on it.
        del self._ops[key]
        cancel(op)
        self._drains.append(op)

    def on_read(self, message: protocol.ControlMessage) -> None:
        sender, op_id = message["sender"], message["op"]
        endpoint = self._peers.endpoint(sender, bytes.fromhex(message["address"]))
        ranges = message["ranges"]
        unregistered = [r for r in ranges if self._memory.find(*r) is None]
        if (sender, op_id) in self._ops or unregistered:
            reason = f"range {unregistered[0][0]:#x}+{unregistered[0][1]} is not registered memory" if unregistered else "duplicate"
            self._stats["rejected_reads"] += 1
            self._control.send(sender, None, "read_reject", op=op_id, reason=reason)
            return
        op = Operation(sender, "inbound_read", time.monotonic() + self._timeout_seconds)
        self._data.send(op, endpoint, ranges, message["tag_base"], message["iov"])
        self._ops[(sender, op_id)] = op

    def poll(self, now: float) -> None:
        for key, op in list(self._ops.items()):
            self._settle(key, op, now)
        self._drains = [op for op in self._drains if not _drained(op, now)]

    def _settle(self, key: tuple[str, int], op: Operation, now: float) -> None:
        # Past its deadline a write fails even if it has just finished: its writer gave up by then (its
        # own deadline came first) and reported the failure; completing it now would contradict that.
        if op.scan() is not None or now > op.deadline:
            self._end(key, op)
        elif op.kind == "inbound_write" and op.data.get("writer_done", True) and op.all_completed:
            del self._ops[key]
            self._control.send(op.peer, None, "write_done", op=key[1])
            self._stats["writes_received"] += 1
            self._stats["bytes_received"] += op.data["bytes"]
            self._listener(op.data["token"], op.data["ranges"], True)
        elif op.kind == "inbound_read" and op.all_completed:
            del self._ops[key]

    def _refusal(self, token: str | None, ranges: list[tuple[int, int]], outside: int | None) -> str | None:
        if outside is not None:
            address, length = ranges[outside]
            return f"range {address:#x}+{length} is not registered memory"
        return self._guard(token, ranges)

    def _end(self, key: tuple[str, int], op: Operation) -> None:
        """An inbound operation failed, expired or was abandoned by its peer."""
        del self._ops[key]
        cancel(op)
        self._peers.drop(op.peer)  # cancels whatever receive is still posted into our memory
        if op.kind == "inbound_write":
            self._listener(op.data["token"], op.data["ranges"], False)


def _drained(op: Operation, now: float) -> bool:
    """Every message of a refused eager write arrived (each receive ends truncated: expected, not an error), or
    every receive of a withdrawn write ended cancelled, or the deadline passed, when those still posted are
    cancelled."""
    if all(request.completed for request in op.requests):
        return True
    if now > op.deadline:
        cancel(op)
        return True
    return False
