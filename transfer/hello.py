"""Hello and its acknowledgement: a peer answers (handshake), within the handshake timeout or not at all."""

from __future__ import annotations

import time
from concurrent.futures import Future

from kvferry.transfer import protocol
from kvferry.transfer.control import ControlChannel
from kvferry.transfer.operation import Operation
from kvferry.transfer.outbound import OutboundOps
from kvferry.transfer.peers import Peers


class Hellos:
    def __init__(self, ops: OutboundOps, control: ControlChannel, peers: Peers, timeout_seconds: float, address: bytes) -> None:
        self._ops = ops
        self._control = control
        self._peers = peers
        self._timeout_seconds = timeout_seconds
        self._address = address.hex()

    def start(self, target: str, future: Future[int]) -> None:
        op = Operation(target, "hello", time.monotonic() + self._timeout_seconds, future)
        op_id = self._ops.new_id()
        self._ops.start(op_id, op, lambda: self._control.send(
            target, op, "hello", refresh=True, address=self._address, op=op_id))

    def on_hello(self, message: protocol.ControlMessage) -> None:
        self._peers.endpoint(message["sender"], bytes.fromhex(message["address"]))
        self._control.send(message["sender"], None, "hello_ack", op=message["op"])

    def on_hello_ack(self, message: protocol.ControlMessage) -> None:
        op = self._ops.expect(message, "hello", "requested")
        if op is not None:
            op.state = "acked"
