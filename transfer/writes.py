"""The writer's side of a write: the exchange on the control tag, and its data.

The writer names the destination ranges; the target checks them and answers ready, with its remote keys
when both sides are host memory. Then the writer puts every range (puts.py), flushes and says complete,
or, for device memory, sends tagged messages into the receives the target posted; the target confirms
with done. A write the target accepted and the writer gave up on is aborted, so that the target ends it
(and the lease behind it) at once.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future

import numpy as np

from kvferry.transfer import protocol
from kvferry.transfer.config import TransferConfig
from kvferry.transfer.control import ControlChannel
from kvferry.transfer.data_messages import DataMessages, new_tag_base
from kvferry.transfer.errors import TransferError, TransferRejectedError, TransferRetriesExhaustedError
from kvferry.transfer.memory import MemoryRegistry
from kvferry.transfer.operation import Operation, fail
from kvferry.transfer.outbound import OutboundOps
from kvferry.transfer.peers import Peers
from kvferry.transfer.puts import Puts

log = logging.getLogger(__name__)


class Writes:
    def __init__(
        self, ops: OutboundOps, control: ControlChannel, peers: Peers, puts: Puts, data: DataMessages,
        memory: MemoryRegistry, config: TransferConfig, address: bytes,
    ) -> None:
        self._ops = ops
        self._control = control
        self._peers = peers
        self._puts = puts
        self._data = data
        self._memory = memory
        self._timeout_seconds = config.timeout_seconds
        self._address = address.hex()

    def start(self, target: str, src: np.ndarray, dst: np.ndarray, lengths: np.ndarray, token: str | None,
              target_address: bytes | None, future: Future[int]) -> None:
        op = Operation(target, "write", time.monotonic() + self._timeout_seconds, future, step=self._step,
                       on_expiry=self._expired)
        op_id = self._ops.new_id()
        regions, outside = self._memory.locate(src, lengths)
        if outside is not None:
            future.set_exception(TransferRejectedError(f"source range {src[outside]:#x}+{lengths[outside]} is not registered"))
            return
        host_only = not any(region.cuda for region in regions)
        op.data = {"lengths": lengths, "src": src, "destinations": dst, "tag_base": new_tag_base()}
        op.payload_bytes = int(np.sum(lengths))
        self._ops.start(op_id, op, lambda: self._control.send(
            target, op, "write", refresh=True, peer_address=target_address, address=self._address, op=op_id,
            tag_base=op.data["tag_base"], ranges=protocol.pack_ranges(dst, lengths), token=token, iov=host_only,
            timeout=op.deadline - time.monotonic(),
        ))

    def on_write_ready(self, message: protocol.ControlMessage) -> None:
        op = self._ops.expect(message, "write", "requested")
        if op is None:
            return
        endpoint = self._peers.endpoint(op.peer)
        if message["rkeys"]:
            self._puts.start(op, endpoint, message["rkeys"])
        else:
            sources = list(zip(op.data["src"].tolist(), op.data["lengths"].tolist(), strict=True))
            self._data.send(op, endpoint, sources, op.data["tag_base"], message["iov"])
        op.state = "sending"

    def on_write_done(self, message: protocol.ControlMessage) -> None:
        op = self._ops.get(message["op"])
        expected = "completing" if op is not None and op.data.get("rma") else "sending"
        op = self._ops.expect(message, "write", expected)
        if op is not None:
            op.state = "confirmed"

    def on_write_reject(self, message: protocol.ControlMessage) -> None:
        op = self._ops.expect(message, "write", "requested")
        if op is not None:
            self._ops.pop(message["op"])
            fail(op, TransferRejectedError(f"{op.peer} refused the write: {message['reason']}"))

    def _step(self, key: int, op: Operation, error: BaseException | None) -> bool:
        """A host write's turn: a round of puts that ended, or the last one landed and the target is to hear."""
        if self._puts.round_ended(op, error):
            self._end_put_round(key, op)
            return True
        if error is None and op.data.get("rma") and op.state == "sending" and op.all_completed:
            op.state = "completing"  # the flush completed: every put has landed; the target's answer ends it
            self._control.send(op.peer, op, "write_complete", op=key)
            return True
        return False

    def _end_put_round(self, key: int, op: Operation) -> None:
        """All landed: say complete, once (the target records the write once). Else retry, or fail."""
        ended = self._puts.end_round(op)
        if not ended.failed:
            op.state = "completing"
            self._control.send(op.peer, op, "write_complete", op=key)
            return
        error = self._puts.retry(op, ended)
        if error is None:
            return
        self._ops.pop(key)
        fail(op, error)
        if isinstance(error, TransferRetriesExhaustedError):
            self._abort(op.peer, key, f"gave up after {error.attempts} attempts")

    def _expired(self, key: int, op: Operation) -> None:
        if op.state != "requested":  # the target holds the write open
            self._abort(op.peer, key, "timed out")

    def _abort(self, peer: str, key: int, reason: str) -> None:
        """Best effort: tell a target that accepted a write we gave up on, so that it ends the write (and
        the lease behind it) now rather than at its own deadline. A dead peer never hears it."""
        try:
            self._control.send(peer, None, "write_abort", refresh=True, op=key, reason=reason)
        except TransferError:
            log.debug("could not tell %s that write %d was abandoned", peer, key)
