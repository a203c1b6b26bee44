"""The reader's side of a read: receives posted into local memory, then a request that the target send
those ranges (the target's side is in inbound.py)."""

from __future__ import annotations

import time
from concurrent.futures import Future

from kvferry.transfer import protocol
from kvferry.transfer.config import TransferConfig
from kvferry.transfer.control import ControlChannel
from kvferry.transfer.data_messages import DataMessages, new_tag_base
from kvferry.transfer.errors import TransferRejectedError
from kvferry.transfer.memory import MemoryRegistry
from kvferry.transfer.operation import Operation, fail
from kvferry.transfer.outbound import OutboundOps
from kvferry.transfer.peers import Peers


class Reads:
    def __init__(
        self, ops: OutboundOps, control: ControlChannel, peers: Peers, data: DataMessages, memory: MemoryRegistry,
        config: TransferConfig, address: bytes,
    ) -> None:
        self._ops = ops
        self._control = control
        self._peers = peers
        self._data = data
        self._memory = memory
        self._timeout_seconds = config.timeout_seconds
        self._address = address.hex()

    def start(self, target: str, local: list[int], remote: list[int], lengths: list[int], future: Future[int]) -> None:
        op = Operation(target, "read", time.monotonic() + self._timeout_seconds, future)
        op_id = self._ops.new_id()
        tag_base = new_tag_base()

        def begin() -> None:
            ranges = list(zip(local, lengths, strict=True))
            iov = not any(self._memory.buffer_region(*r).cuda for r in ranges)
            self._data.receive(op, self._peers.endpoint(target, refresh=True), ranges, tag_base, iov)
            self._control.send(target, op, "read", address=self._address, op=op_id, tag_base=tag_base,
                               ranges=protocol.pack_ranges(remote, lengths), iov=iov)

        try:
            self._ops.start(op_id, op, begin)
        except ValueError as exc:  # a local range outside registered memory
            self._ops.pop(op_id)
            future.set_exception(TransferRejectedError(f"destination {exc}"))

    def on_read_reject(self, message: protocol.ControlMessage) -> None:
        op = self._ops.expect(message, "read", "requested")
        if op is not None:
            self._ops.pop(message["op"])
            self._peers.drop(op.peer)  # cancels the receives we posted for it
            fail(op, TransferRejectedError(f"{op.peer} refused the read: {message['reason']}"))
