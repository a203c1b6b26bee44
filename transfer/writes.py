"""The writer's side of a write: the exchange on the control tag, and its data.

The writer names the destination ranges; the target checks them and answers ready, with its remote keys
when both sides are host memory. Then the writer puts every range (puts.py), flushes and says complete;
the target confirms with done. Writes from device memory go eagerly: the writer's tagged messages leave
right behind the request, and UCX holds each at the target as a rendezvous header (no data moves) until
the target, having checked the write, posts the receives they match; a refused write's messages the
target drains without taking their data (inbound.py). That saves the write_ready round trip: about a
tenth of a 128 MiB write's time on an H100 (docs/transfer.md). A write the target accepted and the writer
gave up on is aborted, so that the target ends it (and the lease behind it) at once.

A prepared write is requested before its data exists (the prefill still computing the KV): the target
checks it and readies its memory meanwhile, the write waits in state "ready", and `send` later starts the
data at once, one source range per destination range requested, or, where the target takes puts (host
memory), any ranges that tile the ranges requested exactly. Withdrawn instead (a source that splits the
ranges of a write of tagged messages), the target ends it without counting it failed, so that an ordinary
write can follow.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from kvferry.transfer import protocol
from kvferry.transfer.batch import merge_adjacent
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
        op.data = {"lengths": lengths, "src": src, "destinations": dst, "tag_base": new_tag_base(),
                   "eager": not host_only, "iov": host_only}
        op.payload_bytes = int(np.sum(lengths))
        self._ops.start(op_id, op, lambda: self._request(op_id, op, dst, lengths, token, target_address))

    def prepare(self, target: str, dst: np.ndarray, lengths: np.ndarray, token: str | None,
                target_address: bytes | None, source_on_device: bool, hold_seconds: float, op_id: int,
                future: Future[int], on_ready: Callable[[bool], None]) -> None:
        """Request a write whose source comes later (send_prepared); it waits at most `hold_seconds` for it.
        `on_ready` hears, once the target accepted it, whether the data will go as puts (any tiling of the
        ranges) or as tagged messages (the ranges as prepared)."""
        op = Operation(target, "write", time.monotonic() + hold_seconds, future, step=self._step,
                       on_expiry=self._expired)
        op.data = {"lengths": lengths, "src": None, "destinations": dst, "tag_base": new_tag_base(),
                   "eager": False, "iov": not source_on_device, "prepared": True, "on_ready": on_ready}
        op.payload_bytes = int(np.sum(lengths))
        self._ops.start(op_id, op, lambda: self._request(op_id, op, dst, lengths, token, target_address))

    def send_prepared(self, op_id: int, src: np.ndarray, dst: np.ndarray | None, lengths: np.ndarray | None) -> None:
        """The data of a prepared write: one source range per destination range prepared (`dst` None), or
        ranges that tile those exactly, which only puts can carry. It starts now if the target is ready, else
        when its answer comes. From here the write has timeout_seconds, as any."""
        op = self._ops.get(op_id)
        if op is None:  # refused or expired already: its future says why
            return
        if dst is not None and lengths is not None:  # PreparedWrite lets only a write of puts (ready) retile
            refusal = _tiling_refusal(op, dst, lengths) or self._source_refusal(op, src, lengths)
            if refusal is None:
                op.data.update(destinations=dst, lengths=lengths)
        else:
            refusal = self._source_refusal(op, src, op.data["lengths"])
        if refusal is not None:
            self._ops.pop(op_id)
            fail(op, TransferRejectedError(refusal))
            self._withdraw_message(op.peer, op_id)
            return
        op.data["src"] = src
        op.deadline = min(op.deadline, time.monotonic() + self._timeout_seconds)
        if op.state == "ready":
            ready = op.data.pop("ready")
            self._ops.guard(op_id, op, lambda: self._start_data(op_id, op, ready["rkeys"], ready["iov"]))

    def _source_refusal(self, op: Operation, src: np.ndarray, lengths: np.ndarray) -> str | None:
        if len(src) != len(lengths):
            return f"{len(src)} source ranges for {len(lengths)} destination ranges"
        regions, outside = self._memory.locate(src, lengths)
        if outside is not None:
            return f"source range {src[outside]:#x}+{lengths[outside]} is not registered"
        if any(region.cuda for region in regions) == op.data["iov"]:
            return "the source is not in the memory (host or device) the write was prepared for"
        return None

    def withdraw(self, op_id: int) -> None:
        """Give up a prepared write before its data: the target ends it and its lease stays open."""
        op = self._ops.get(op_id)
        if op is None or op.data["src"] is not None:
            return
        self._ops.pop(op_id)
        if op.future is not None:
            op.future.cancel()
        self._withdraw_message(op.peer, op_id)

    def _withdraw_message(self, peer: str, op_id: int) -> None:
        try:
            self._control.send(peer, None, "write_withdraw", op=op_id)
        except TransferError:
            log.debug("could not tell %s that write %d was withdrawn", peer, op_id)

    def _request(self, op_id: int, op: Operation, dst: np.ndarray, lengths: np.ndarray, token: str | None,
                 target_address: bytes | None) -> None:
        eager = op.data["eager"]
        self._control.send(
            op.peer, op, "write", refresh=True, peer_address=target_address, address=self._address, op=op_id,
            tag_base=op.data["tag_base"], ranges=protocol.pack_ranges(dst, lengths), token=token, iov=op.data["iov"],
            timeout=op.deadline - time.monotonic(), eager=eager, **({"prepared": True} if "prepared" in op.data else {}),
        )
        if eager:
            self._send_messages(op, iov=False)

    def on_write_ready(self, message: protocol.ControlMessage) -> None:
        # An eager write is "sending" already, so a target that predates eager writes, and answers ready
        # anyway, has its ready counted as a duplicate here and the write goes on.
        op = self._ops.expect(message, "write", "requested")
        if op is None:
            return
        if "prepared" in op.data:
            op.data["on_ready"](bool(message["rkeys"]))
        if op.data["src"] is None:  # prepared, and its data not given yet: send_prepared starts it
            op.data["ready"] = {"rkeys": message["rkeys"], "iov": message["iov"]}
            op.state = "ready"
            return
        self._start_data(message["op"], op, message["rkeys"], message["iov"])

    def _start_data(self, op_id: int, op: Operation, rkeys: list[list[object]], iov: bool) -> None:
        if rkeys:
            self._puts.start(op, self._peers.endpoint(op.peer), rkeys)
            op.state = "sending"
            return
        if "prepared" in op.data:  # the target's receives wait posted, its loop asleep: it polls from this
            self._control.send(op.peer, op, "write_data", op=op_id)
        self._send_messages(op, iov)

    def _send_messages(self, op: Operation, iov: bool) -> None:
        sources = list(zip(op.data["src"].tolist(), op.data["lengths"].tolist(), strict=True))
        self._data.send(op, self._peers.endpoint(op.peer), sources, op.data["tag_base"], iov)
        op.state = "sending"

    def on_write_done(self, message: protocol.ControlMessage) -> None:
        op = self._ops.get(message["op"])
        expected = "completing" if op is not None and op.data.get("rma") else "sending"
        op = self._ops.expect(message, "write", expected)
        if op is not None:
            op.state = "confirmed"

    def on_write_reject(self, message: protocol.ControlMessage) -> None:
        op = self._ops.get(message["op"])
        # An eager write is refused while its messages are out (the target drains them).
        state = "sending" if op is not None and op.data.get("eager") else "requested"
        op = self._ops.expect(message, "write", state)
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


def _tiling_refusal(op: Operation, dst: np.ndarray, lengths: np.ndarray) -> str | None:
    """None when (dst, lengths) cover the ranges prepared exactly, each byte once: sorted and merged, both
    are the same ranges (the target completes the write over the ranges it accepted)."""
    order = np.argsort(dst, kind="stable")
    ends = dst[order] + lengths[order]
    if len(order) > 1 and bool((dst[order][1:] < ends[:-1]).any()):
        return "the ranges overlap"
    given, _, given_lengths = merge_adjacent(dst[order], dst[order], lengths[order])
    prepared_order = np.argsort(op.data["destinations"], kind="stable")
    prepared = op.data["destinations"][prepared_order]
    wanted, _, wanted_lengths = merge_adjacent(prepared, prepared, op.data["lengths"][prepared_order])
    if not (np.array_equal(given, wanted) and np.array_equal(given_lengths, wanted_lengths)):
        return "the ranges do not cover the ranges prepared exactly"
    return None
