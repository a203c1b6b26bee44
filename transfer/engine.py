"""A transfer engine over UCX with the API of Mooncake's TransferEngine.

    engine = TransferEngine()
    engine.initialize("decode-0", "redis://127.0.0.1:6379/0", "ucx")
    engine.register_memory(pool.data_ptr(), pool.nbytes)
    engine.batch_transfer_write("decode-1", src_addrs, dst_addrs, lengths)   # 0, or a TransferError

A write is a short exchange on the control tag: the writer names the destination ranges, the target
checks them against its registered memory (and its write guard, which the KV connector uses for
leases) and answers ready with its remote keys; the writer puts every range (one-sided RMA through
ucp_direct, since ucxx has no put), flushes, says complete, and the target confirms with done. Device
memory instead moves as tagged messages into receives the target posted. Every UCX call happens on
one loop thread; callers get futures. Every operation has a deadline.
"""

from __future__ import annotations

import itertools
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvferry.transfer import protocol, ucp_direct
from kvferry.transfer.config import TransferConfig
from kvferry.transfer.errors import (
    PeerUnreachableError,
    TransferError,
    TransferRejectedError,
    TransferRetriesExhaustedError,
    TransferTimeoutError,
)
from kvferry.transfer.memory import MemoryRegistry
from kvferry.transfer.registry import PeerRegistry, registry_from
from kvferry.transfer.ucx import Request, UcxWorker, request_error

log = logging.getLogger(__name__)

PROTOCOLS = ("ucx",)
MAX_RANGES_PER_BATCH = protocol.MAX_RANGES
_INDEX_BITS = 20

# A write guard sees (token, [(address, length), ...]) and returns None to accept or a reason to refuse.
WriteGuard = Callable[[str | None, list[tuple[int, int]]], str | None]
# Told (token, ranges, ok) when a write into this engine's memory completed or failed.
WriteListener = Callable[[str | None, list[tuple[int, int]], bool], None]


@dataclass
class _Operation:
    """One batch in flight; `requests` are polled, `keep` holds buffers UCX still reads or writes."""

    peer: str
    kind: str
    deadline: float
    future: Future[int] | None = None
    requests: list[Request] = field(default_factory=list)
    keep: list[object] = field(default_factory=list)
    state: str = "requested"
    data: dict[str, Any] = field(default_factory=dict)
    checked: int = 0  # requests[:checked] completed without error

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


class TransferEngine:
    def __init__(self, config: TransferConfig | None = None) -> None:
        self.config = config or TransferConfig()
        self.memory = MemoryRegistry()
        self.write_guard: WriteGuard | None = None
        self.on_write_finished: WriteListener | None = None
        self.stats = {
            "malformed_messages": 0, "rejected_writes": 0, "duplicate_messages": 0, "bytes_sent": 0,
            # puts issued (retried ones again), and attempts after a first one that did not all land
            "puts": 0, "put_retries": 0,
            # of those puts, plain copies into a peer's shared memory attached here (ucp_direct.put_many)
            "puts_copied": 0,
            # writes into this engine's memory: completed (each told to the listener once), aborted by the writer
            "writes_received": 0, "bytes_received": 0, "aborted_writes": 0,
        }
        self.local_name = ""
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._ops = itertools.count(1)
        self._outbound: dict[int, _Operation] = {}
        self._inbound: dict[tuple[str, int], _Operation] = {}
        self._endpoints: dict[str, tuple[bytes, Any]] = {}
        self._rkeys: dict[str, dict[str, int]] = {}  # peer -> packed remote key -> unpacked, per endpoint
        self._control: list[tuple[Request, bytearray]] = []
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- Mooncake-shaped API ----------------------------------------------------------------
    def initialize(
        self, local_name: str, metadata: str | PeerRegistry, protocol_name: str = "ucx", **record: object
    ) -> int:
        if protocol_name not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS} (UCX picks shm, CMA, TCP, RDMA or CUDA IPC)")
        self.local_name = local_name
        self.registry = registry_from(metadata)
        self._start_worker()
        self.address = self.worker.address
        self._record = record
        try:
            self.publish(**record)
        except Exception as exc:  # noqa: BLE001 - a registry that is down now: the heartbeat publishes later
            log.warning("registry unreachable at start (%s); %s will publish once it answers", exc, local_name)
        threading.Thread(target=self._heartbeat, name=f"kvferry-transfer-heartbeat-{local_name}", daemon=True).start()
        for _ in range(self.config.control_receives):
            self._post_control_receive()
        self._thread = threading.Thread(target=self._loop, name=f"kvferry-transfer-{local_name}", daemon=True)
        self._thread.start()
        return 0

    def _start_worker(self) -> None:
        """Once: at initialize, or before it when a host pool is allocated first (LLMEngine's pool_allocator)."""
        if getattr(self, "worker", None) is None:
            self.worker = UcxWorker({"CMA_TX_QUOTA": str(self.config.cma_segments_per_progress)})

    def publish(self, **record: object) -> None:
        """(Re)publish this engine's record: its worker address plus whatever the caller adds."""
        # updated_at lets readers of a registry without TTLs (a folder) tell a dead node's record.
        self.registry.publish(self.local_name, {"address": self.address.hex(), **record, "updated_at": time.time()})

    def update_record(self, **fields: object) -> None:
        """Merge `fields` into the record the heartbeat publishes (a node's load), and publish it now."""
        self._record = {**self._record, **fields}
        self.publish(**self._record)

    def _heartbeat(self) -> None:
        # Registry records carry a TTL so that dead engines drop out; a live one keeps refreshing it.
        while not self._closing.wait(self.config.heartbeat_seconds):
            try:
                self.publish(**self._record)
            except Exception:  # noqa: BLE001 - Redis down: peers keep their cached endpoints meanwhile
                log.warning("could not refresh the registry record of %s", self.local_name)

    def register_memory(self, address: int, length: int, cuda_device: int | None = None) -> int:
        """Host memory (`cuda_device` None) is also mapped for RMA, so that peers can put into it; device
        memory moves by tagged messages through CUDA IPC, and its GPU first becomes current on the loop
        thread, which drives every UCX operation: UCX's CUDA transports work in the CUDA context current on
        the calling thread, and a fresh thread's is GPU 0's, wherever the memory lives."""

        def register() -> None:
            if cuda_device is not None:
                import torch

                torch.cuda.set_device(cuda_device)
            mapped = () if cuda_device is not None else ucp_direct.map_memory(self.worker.context_handle, address, length)
            self.memory.register(address, length, cuda_device is not None, *mapped)

        self._call(register)
        return 0

    def allocate_managed_buffer(self, length: int) -> int:
        """Host memory allocated and registered by UCX (Mooncake's call of the same name): the address
        of at least `length` bytes. A writer on the same host puts into it by copying into the shared
        segment it attached (System V or POSIX shared memory), with no system call per 512 KiB as into
        memory from register_memory (CMA); across hosts it is RDMA memory like any other. Free it with
        free_managed_buffer; it is gone when the process ends either way."""
        allocated: list[int] = []
        self._start_worker()  # before initialize: the node allocates its pool before it starts the engine

        def allocate() -> None:
            memh, address, size, rkey = ucp_direct.allocate_memory(self.worker.context_handle, length)
            self.memory.register(address, size, False, memh, rkey)
            allocated.append(address)

        self._call(allocate)
        return allocated[0]

    def free_managed_buffer(self, address: int, length: int = 0) -> int:
        """Unmaps and frees memory from allocate_managed_buffer (`length` is Mooncake's, not needed)."""
        return self.unregister_memory(address)

    def unregister_memory(self, address: int) -> int:
        def unregister() -> None:
            region = self.memory.unregister(address)
            if region.memh is not None:
                ucp_direct.unmap_memory(self.worker.context_handle, region.memh)

        self._call(unregister)
        return 0

    def batch_transfer_write_async(
        self, target: str, src_addrs: list[int], dst_addrs: list[int], lengths: list[int], token: str | None = None
    ) -> Future[int]:
        src, dst, sizes = merge_adjacent(*batch_columns(src_addrs, dst_addrs, lengths))
        future: Future[int] = Future()
        self._submit(lambda: self._start_write(target, src, dst, sizes, token, future))
        return future

    def batch_transfer_write(
        self, target: str, src_addrs: list[int], dst_addrs: list[int], lengths: list[int], token: str | None = None
    ) -> int:
        return self.batch_transfer_write_async(target, src_addrs, dst_addrs, lengths, token).result()

    def batch_transfer_read_async(
        self, target: str, local_addrs: list[int], remote_addrs: list[int], lengths: list[int]
    ) -> Future[int]:
        local, remote, sizes = (column.tolist() for column in merge_adjacent(*batch_columns(local_addrs, remote_addrs, lengths)))
        future: Future[int] = Future()
        self._submit(lambda: self._start_read(target, local, remote, sizes, future))
        return future

    def batch_transfer_read(self, target: str, local_addrs: list[int], remote_addrs: list[int], lengths: list[int]) -> int:
        return self.batch_transfer_read_async(target, local_addrs, remote_addrs, lengths).result()

    def handshake(self, target: str) -> int:
        """Check that `target` answers; fails within the handshake timeout for a closed peer."""
        future: Future[int] = Future()
        self._submit(lambda: self._start_hello(target, future))
        return future.result()

    def in_flight(self) -> int:
        """Operations not finished yet, either way (a leak check: 0 once every transfer ended)."""
        return len(self._outbound) + len(self._inbound)

    def close(self) -> None:
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if getattr(self, "registry", None) is not None and self.local_name:
            try:
                self.registry.remove(self.local_name)
            except Exception:  # noqa: BLE001 - a registry that is gone needs no cleanup
                log.debug("registry removal failed for %s", self.local_name)

    # ---- the loop ---------------------------------------------------------------------------
    def _submit(self, command: Callable[[], None]) -> None:
        """Queue a command for the loop thread and wake it: sleeping in epoll, it would otherwise take
        the command up to idle_wait_ms late (a millisecond per batch is a tenth of a 64 MiB write)."""
        self._commands.put(command)
        if self._thread is not None:
            ucp_direct.wake(self.worker.handle)

    def _call(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the loop thread (UCX and the op tables are single-threaded) and wait for it."""
        if self._thread is None or threading.current_thread() is self._thread:
            fn()
            return
        done: Future[None] = Future()

        def run() -> None:
            try:
                fn()
                done.set_result(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.set_exception(exc)

        self._submit(run)
        done.result()

    @staticmethod
    def _run_safely(fn: Callable[[], object]) -> object:
        # The loop must outlive any one bad command or message; the failing operation reports through
        # its own future where it has one.
        try:
            return fn()
        except Exception:
            log.exception("transfer engine loop step failed")
            return None

    def _loop(self) -> None:
        while not self._closing.is_set():
            while not self._commands.empty():
                self._run_safely(self._commands.get())
            self._run_safely(self._poll_control)
            now = time.monotonic()
            for key, op in list(self._outbound.items()):
                self._poll_outbound(key, op, now)
            for key, op in list(self._inbound.items()):
                self._poll_inbound(key, op, now)
            operations = [*self._outbound.values(), *self._inbound.values()]
            if not self._commands.empty() or any(not op.all_completed for op in operations):
                self.worker.progress()  # our requests in flight move only while this thread progresses
            else:
                # Only a peer's message (a reply, a write) or a command can come next: sleep in epoll
                # until it does. A message wakes it over shared memory too (UCX signals an armed
                # receiver), a command through ucp_worker_signal; idle_wait_ms bounds how late a
                # deadline is seen. Polling with backoff instead (up to 400 us) put one to three
                # polling delays into every write.
                self.worker.wait_for_events(self.config.idle_wait_ms)
        for op in list(self._outbound.values()):
            _fail(op, TransferError("transfer engine closed"))
        for peer in list(self._rkeys):  # remote keys are UCX objects of this worker: give them back
            for rkey in self._rkeys.pop(peer).values():
                ucp_direct.destroy_rkey(rkey)

    # ---- endpoints and control messages -----------------------------------------------------
    def _endpoint(self, peer: str, address: bytes | None = None, refresh: bool = False) -> Any:
        """The cached endpoint to `peer`. A new operation passes refresh=True: the registry is asked for
        the peer's current address, so a peer that restarted (new address) gets a new endpoint. Replies
        inside an operation use the cache, or the address the peer sent."""
        cached = self._endpoints.get(peer)
        if address is None and (refresh or cached is None):
            record = self.registry.lookup(peer)
            if record is None:
                raise PeerUnreachableError(f"peer {peer!r} is not in the registry")
            address = bytes.fromhex(str(record["address"]))
        if cached is not None and (address is None or cached[0] == address):
            return cached[1]
        endpoint = self.worker.connect(address)  # a restarted peer has a new address: a new endpoint
        self._endpoints[peer] = (address, endpoint)
        return endpoint

    def _drop_endpoint(self, peer: str) -> None:
        for rkey in self._rkeys.pop(peer, {}).values():
            ucp_direct.destroy_rkey(rkey)
        cached = self._endpoints.pop(peer, None)
        if cached is not None:
            cached[1].close()  # cancels the requests still tied to it

    def _send_control(self, peer: str, track: _Operation | None, kind: str, refresh: bool = False, **fields: Any) -> None:
        """Send a control message; `track` (the operation it belongs to) keeps it alive and polls it;
        `refresh` (a new operation) asks the registry for the peer's current address first."""
        message = protocol.encode(kind, sender=self.local_name, **fields)
        request = UcxWorker.send(self._endpoint(peer, refresh=refresh), message, protocol.CONTROL_TAG)
        if track is not None:
            track.requests.append(request)
            track.keep.append(message)

    def _post_control_receive(self) -> None:
        buffer = bytearray(protocol.CONTROL_BUFFER_BYTES)
        self._control.append((self.worker.recv_any(buffer, protocol.CONTROL_TAG), buffer))

    def _poll_control(self) -> bool:
        """Handle the control messages that arrived; True if there were any."""
        pending = []
        for request, buffer in self._control:
            if not request.completed:
                pending.append((request, buffer))
                continue
            if request_error(request) is None:
                try:
                    self._handle(protocol.decode(memoryview(buffer)))
                except protocol.MalformedMessage as exc:
                    self.stats["malformed_messages"] += 1
                    log.warning("dropped a malformed control message: %s", exc)
        received = len(pending) < len(self._control)
        self._control = pending
        while len(self._control) < self.config.control_receives and not self._closing.is_set():
            self._post_control_receive()
        return received

    def _handle(self, message: protocol.ControlMessage) -> None:
        log.debug("%s <- %s op %s from %s", self.local_name, message.kind, message.fields.get("op"), message.fields.get("sender"))
        handler = getattr(self, f"_on_{message.kind}")
        handler(message)

    # ---- writes -----------------------------------------------------------------------------
    def _start_write(self, target: str, src: np.ndarray, dst: np.ndarray, lengths: np.ndarray, token: str | None, future: Future[int]) -> None:
        op = _Operation(target, "write", time.monotonic() + self.config.timeout_seconds, future)
        op_id = next(self._ops)
        regions, outside = self.memory.locate(src, lengths)
        if outside is not None:
            future.set_exception(TransferRejectedError(f"source range {src[outside]:#x}+{lengths[outside]} is not registered"))
            return
        host_only = not any(region.cuda for region in regions)
        op.data = {"lengths": lengths, "src": src, "destinations": dst, "tag_base": random.getrandbits(40) << _INDEX_BITS}
        self._outbound[op_id] = op
        self._guarded(op_id, op, lambda: self._send_control(
            target, op, "write", refresh=True, address=self.address.hex(), op=op_id, tag_base=op.data["tag_base"],
            ranges=protocol.pack_ranges(dst, lengths), token=token, iov=host_only, timeout=op.deadline - time.monotonic(),
        ))

    def _guarded(self, key: int, op: _Operation, action: Callable[[], None]) -> None:
        try:
            action()
        except TransferError as exc:
            self._outbound.pop(key, None)
            _fail(op, exc)

    def _on_write_ready(self, message: protocol.ControlMessage) -> None:
        op = self._expect_outbound(message, "write", "requested")
        if op is None:
            return
        endpoint = self._endpoint(op.peer)
        if message["rkeys"]:
            op.data.update(rkeys=message["rkeys"], attempts=1)
            self._put_data(op, endpoint, range(len(op.data["lengths"])))
        else:
            sources = list(zip(op.data["src"].tolist(), op.data["lengths"].tolist(), strict=True))
            self._send_data(op, endpoint, sources, op.data["tag_base"], message["iov"])
        op.state = "sending"

    def _put_data(self, op: _Operation, endpoint: Any, pending: Sequence[int]) -> None:
        """One-sided puts of the ranges at `pending` (indices into the batch) straight into the target's
        ranges (a CMA process_vm_writev on one host, RDMA WRITE across hosts; the target's CPU takes no
        part), then one flush. Every range is a put, small ones too: with UCX draining many CMA segments
        per progress call, a 16 KiB put costs a few microseconds, a third of the CPU of the scatter-gather
        messages small ranges took before. The per-range work is vectorised: a batch of 64 KiB blocks
        holds 1024 ranges, of 16 KiB 4096."""
        regions = sorted((int(base), self._rkey(op.peer, endpoint, packed)) for base, packed in op.data["rkeys"])
        bases = np.array([base for base, _ in regions], dtype=np.int64)
        keys = np.array([key for _, key in regions], dtype=np.int64)
        src, dst, lengths = op.data["src"], op.data["destinations"], op.data["lengths"]
        if len(pending) < len(lengths):  # a retry: only the ranges that did not land
            src, dst, lengths = (values[np.asarray(pending)] for values in (src, dst, lengths))
        region_keys = keys[np.searchsorted(bases, dst, side="right") - 1]
        batch = ucp_direct.put_many(endpoint.handle, src, lengths, dst, region_keys)
        flush = ucp_direct.flush(endpoint.handle, self.worker.handle)
        op.requests.append(flush)
        op.data.update(rma=True, pending=pending, batch=batch, flush=flush)
        self.stats["puts"] += len(lengths)
        self.stats["puts_copied"] += batch.copied

    def _end_put_attempt(self, key: int, op: _Operation) -> None:
        """The flush after a round of puts completed. All landed: say complete. Some did not (UCX answered
        a put with an error, or the flush failed, which confirms none): put those again on a new endpoint
        (a failed put leaves its endpoint failed), up to max_retries times within the write's deadline,
        then fail naming the peer and the attempts. The target sees puts only; write_complete goes once,
        after the attempt where everything landed, so it records the write once."""
        flush, batch, pending = op.data.pop("flush"), op.data.pop("batch"), op.data.pop("pending")
        if flush.status != ucp_direct.UCS_OK:
            op.requests.remove(flush)  # handled here, not an error of the operation for scan()
            failed, status = list(pending), flush.status
        else:
            failed, status = [pending[i] for i in batch.failed], batch.status
        if not failed:
            op.state = "completing"
            self._send_control(op.peer, op, "write_complete", op=key)
            return
        attempts = op.data["attempts"]
        reason = f"{len(failed)} of {len(pending)} ranges did not land ({ucp_direct.status_string(status)})"
        self._drop_endpoint(op.peer)
        if attempts > self.config.max_retries:
            self._outbound.pop(key, None)
            _fail(op, TransferRetriesExhaustedError(op.peer, attempts, reason))
            self._abort_write(op.peer, key, f"gave up after {attempts} attempts")
            return
        log.warning("write to %s: %s; retrying them (attempt %d)", op.peer, reason, attempts + 1)
        op.data["attempts"] = attempts + 1
        self.stats["put_retries"] += 1
        self._guarded(key, op, lambda: self._put_data(op, self._endpoint(op.peer, refresh=True), failed))

    def _abort_write(self, peer: str, key: int, reason: str) -> None:
        """Best effort: tell a target that accepted a write we gave up on, so that it ends the write (and
        the lease behind it) now rather than at its own deadline. A dead peer never hears it."""
        try:
            self._send_control(peer, None, "write_abort", refresh=True, op=key, reason=reason)
        except TransferError:
            log.debug("could not tell %s that write %d was abandoned", peer, key)

    def _rkey(self, peer: str, endpoint: Any, packed: str) -> int:
        cache = self._rkeys.setdefault(peer, {})
        if packed not in cache:
            cache[packed] = ucp_direct.unpack_rkey(endpoint.handle, bytes.fromhex(packed))
        return cache[packed]

    def _on_write_done(self, message: protocol.ControlMessage) -> None:
        op = self._outbound.get(message["op"])
        expected = "completing" if op is not None and op.data.get("rma") else "sending"
        op = self._expect_outbound(message, "write", expected)
        if op is not None:
            op.state = "confirmed"

    def _on_write_reject(self, message: protocol.ControlMessage) -> None:
        op = self._expect_outbound(message, "write", "requested")
        if op is not None:
            del self._outbound[message["op"]]
            _fail(op, TransferRejectedError(f"{op.peer} refused the write: {message['reason']}"))

    def _expect_outbound(self, message: protocol.ControlMessage, kind: str, state: str) -> _Operation | None:
        """The operation a reply is for, if it is in the state that reply may come in; else None.
        Late, repeated or forged replies are counted and ignored."""
        op = self._outbound.get(message["op"])
        if op is None or op.kind != kind or op.peer != message["sender"] or op.state != state:
            self.stats["duplicate_messages"] += 1
            return None
        return op

    def _poll_outbound(self, key: int, op: _Operation, now: float) -> None:
        error = op.scan()
        flush = op.data.get("flush")
        if flush is not None and flush.completed and (error is None or op.requests[op.checked] is flush):
            self._end_put_attempt(key, op)
            return
        if error is not None:
            self._outbound.pop(key, None)
            _cancel(op)
            self._drop_endpoint(op.peer)
            _fail(op, PeerUnreachableError(f"{op.kind} with {op.peer} failed: {error}"))
            return
        if op.data.get("rma") and op.state == "sending" and op.all_completed:
            # The flush completed: every put has landed. Tell the target, whose answer ends the write.
            op.state = "completing"
            self._send_control(op.peer, op, "write_complete", op=key)
            return
        # A write is over once its sends completed and the target confirmed; a read once its receives
        # completed; a hello once acknowledged.
        finished = op.all_completed and op.state == {"write": "confirmed", "read": "requested", "hello": "acked"}[op.kind]
        if finished:
            self._outbound.pop(key, None)
            self.stats["bytes_sent"] += int(np.sum(op.data["lengths"])) if op.kind == "write" else 0
            if op.future is not None and not op.future.done():
                op.future.set_result(0)
        elif now > op.deadline:
            self._outbound.pop(key, None)
            _cancel(op)
            self._drop_endpoint(op.peer)
            _fail(op, TransferTimeoutError(f"{op.kind} with {op.peer} did not finish in time (state {op.state})"))
            if op.kind == "write" and op.state != "requested":  # the target holds the write open
                self._abort_write(op.peer, key, "timed out")

    def _on_write(self, message: protocol.ControlMessage) -> None:
        sender, op_id = message["sender"], message["op"]
        if (sender, op_id) in self._inbound:
            self.stats["duplicate_messages"] += 1
            return
        ranges, (addresses, lengths) = message["ranges"], message["range_columns"]
        regions, outside = self.memory.locate(addresses, lengths)
        reason = self._refusal(message["token"], ranges, outside)
        address = bytes.fromhex(message["address"])
        if reason is not None:
            self.stats["rejected_writes"] += 1
            self._endpoint(sender, address)
            self._send_control(sender, None, "write_reject", op=op_id, reason=reason)
            return
        # Held no longer than the writer waits: once it gave up (and said so to its caller) the write
        # must not complete here, even if this process was stopped and is only now catching up.
        hold = max(0.0, min(self.config.timeout_seconds, message["timeout"]))
        op = _Operation(sender, "inbound_write", time.monotonic() + hold)
        op.data = {"token": message["token"], "ranges": ranges, "bytes": int(lengths.sum())}
        endpoint = self._endpoint(sender, address)
        if message["iov"] and not any(region.cuda for region in regions):
            # Host to host: the writer puts every range (RMA) into this memory; its write_complete,
            # sent once its flush completed, ends the write.
            rkeys = {region.address: region.rkey.hex() for region in regions}
            op.data.update(rma=True, writer_done=False)
            self._inbound[(sender, op_id)] = op
            self._send_control(sender, None, "write_ready", op=op_id, iov=True, rkeys=[[a, k] for a, k in rkeys.items()])
            return
        self._receive_data(op, endpoint, ranges, message["tag_base"], False)
        self._inbound[(sender, op_id)] = op
        self._send_control(sender, None, "write_ready", op=op_id, iov=False, rkeys=[])

    def _on_write_complete(self, message: protocol.ControlMessage) -> None:
        op = self._inbound.get((message["sender"], message["op"]))
        if op is None or not op.data.get("rma") or op.data["writer_done"]:
            self.stats["duplicate_messages"] += 1
            return
        op.data["writer_done"] = True  # every put landed before the writer sent this; _poll_inbound ends it

    def _on_write_abort(self, message: protocol.ControlMessage) -> None:
        key = (message["sender"], message["op"])
        op = self._inbound.get(key)
        if op is None or op.kind != "inbound_write":
            self.stats["duplicate_messages"] += 1
            return
        log.warning("%s abandoned write %s: %s", key[0], key[1], message["reason"])
        self.stats["aborted_writes"] += 1
        self._end_inbound(key, op)

    def _refusal(self, token: str | None, ranges: list[tuple[int, int]], outside: int | None) -> str | None:
        if outside is not None:
            address, length = ranges[outside]
            return f"range {address:#x}+{length} is not registered memory"
        if self.write_guard is not None:
            return self.write_guard(token, ranges)
        return None

    def _poll_inbound(self, key: tuple[str, int], op: _Operation, now: float) -> None:
        # Past its deadline a write fails even if it has just finished: its writer gave up by then (its
        # own deadline came first) and reported the failure; completing it now would contradict that.
        if op.scan() is not None or now > op.deadline:
            self._end_inbound(key, op)
        elif op.kind == "inbound_write" and op.data.get("writer_done", True) and op.all_completed:
            del self._inbound[key]
            self._send_control(op.peer, None, "write_done", op=key[1])
            self.stats["writes_received"] += 1
            self.stats["bytes_received"] += op.data["bytes"]
            self._notify(op.data, True)
        elif op.kind == "inbound_read" and op.all_completed:
            del self._inbound[key]

    def _end_inbound(self, key: tuple[str, int], op: _Operation) -> None:
        """An inbound operation failed, expired or was abandoned by its peer."""
        del self._inbound[key]
        _cancel(op)
        self._drop_endpoint(op.peer)  # cancels whatever receive is still posted into our memory
        if op.kind == "inbound_write":
            self._notify(op.data, False)

    def _notify(self, write: dict[str, Any], ok: bool) -> None:
        if self.on_write_finished is not None:
            self.on_write_finished(write["token"], write["ranges"], ok)

    # ---- data messages ----------------------------------------------------------------------
    def _plan(self, ranges: list[tuple[int, int]], iov: bool) -> list[tuple[int, list[tuple[int, int]]]]:
        return plan_messages(ranges, iov, self.config.min_zero_copy_bytes, self.config.max_ranges_per_message)

    def _send_data(self, op: _Operation, endpoint: Any, ranges: list[tuple[int, int]], tag_base: int, host: bool) -> None:
        """Host memory goes through the direct UCP binding (cheaper per message than ucxx's objects);
        device memory through ucxx, which describes it to UCX as CUDA memory (CUDA IPC)."""
        for offset, group in self._plan(ranges, host):
            if host:
                op.requests.append(ucp_direct.send(endpoint.handle, self.worker.handle, group, tag_base | offset))
                continue
            buffer = self.memory.buffer(*group[0])
            op.keep.append(buffer)
            op.requests.append(UcxWorker.send(endpoint, buffer, tag_base | offset))

    def _receive_data(self, op: _Operation, endpoint: Any, ranges: list[tuple[int, int]], tag_base: int, host: bool) -> None:
        for offset, group in self._plan(ranges, host):
            if host:
                op.requests.append(ucp_direct.recv(self.worker.handle, group, tag_base | offset))
                continue
            buffer = self.memory.buffer(*group[0])
            op.keep.append(buffer)
            op.requests.append(UcxWorker.recv(endpoint, buffer, tag_base | offset))

    # ---- reads ------------------------------------------------------------------------------
    def _start_read(self, target: str, local: list[int], remote: list[int], lengths: list[int], future: Future[int]) -> None:
        op = _Operation(target, "read", time.monotonic() + self.config.timeout_seconds, future)
        op_id = next(self._ops)
        tag_base = random.getrandbits(40) << _INDEX_BITS
        op.data = {"lengths": lengths}

        def begin() -> None:
            ranges = list(zip(local, lengths, strict=True))
            iov = not any(self.memory.buffer_region(*r).cuda for r in ranges)
            self._receive_data(op, self._endpoint(target, refresh=True), ranges, tag_base, iov)
            self._send_control(target, op, "read", address=self.address.hex(), op=op_id, tag_base=tag_base,
                               ranges=protocol.pack_ranges(remote, lengths), iov=iov)

        self._outbound[op_id] = op
        try:
            self._guarded(op_id, op, begin)
        except ValueError as exc:
            self._outbound.pop(op_id, None)
            future.set_exception(TransferRejectedError(f"destination {exc}"))

    def _on_read(self, message: protocol.ControlMessage) -> None:
        sender, op_id = message["sender"], message["op"]
        endpoint = self._endpoint(sender, bytes.fromhex(message["address"]))
        ranges = message["ranges"]
        unregistered = [r for r in ranges if self.memory.find(*r) is None]
        if (sender, op_id) in self._inbound or unregistered:
            reason = f"range {unregistered[0][0]:#x}+{unregistered[0][1]} is not registered memory" if unregistered else "duplicate"
            self._send_control(sender, None, "read_reject", op=op_id, reason=reason)
            return
        op = _Operation(sender, "inbound_read", time.monotonic() + self.config.timeout_seconds)
        self._send_data(op, endpoint, ranges, message["tag_base"], message["iov"])
        self._inbound[(sender, op_id)] = op

    def _on_read_reject(self, message: protocol.ControlMessage) -> None:
        op = self._expect_outbound(message, "read", "requested")
        if op is not None:
            del self._outbound[message["op"]]
            self._drop_endpoint(op.peer)  # cancels the receives we posted for it
            _fail(op, TransferRejectedError(f"{op.peer} refused the read: {message['reason']}"))

    # ---- hello ------------------------------------------------------------------------------
    def _start_hello(self, target: str, future: Future[int]) -> None:
        op = _Operation(target, "hello", time.monotonic() + self.config.handshake_timeout_seconds, future)
        op_id = next(self._ops)
        self._outbound[op_id] = op
        self._guarded(op_id, op, lambda: self._send_control(
            target, op, "hello", refresh=True, address=self.address.hex(), op=op_id))

    def _on_hello(self, message: protocol.ControlMessage) -> None:
        self._endpoint(message["sender"], bytes.fromhex(message["address"]))
        self._send_control(message["sender"], None, "hello_ack", op=message["op"])

    def _on_hello_ack(self, message: protocol.ControlMessage) -> None:
        op = self._expect_outbound(message, "hello", "requested")
        if op is not None:
            op.state = "acked"


def _cancel(op: _Operation) -> None:
    """Withdraw scatter-gather requests still posted (ucxx's own are cancelled with their endpoint)."""
    for request in op.requests[op.checked :]:
        if isinstance(request, ucp_direct.UcpRequest):
            request.cancel()


def _fail(op: _Operation, error: TransferError) -> None:
    if op.future is not None and not op.future.done():
        op.future.set_exception(error)


_GROUP_TAG_BIT = 1 << (_INDEX_BITS - 1)


def plan_messages(
    ranges: list[tuple[int, int]], iov: bool, min_zero_copy_bytes: int, max_ranges_per_message: int
) -> list[tuple[int, list[tuple[int, int]]]]:
    """How a batch travels: (tag offset, ranges) per message, computed alike on both sides from the
    same lengths. A range of at least min_zero_copy_bytes goes alone, since UCX moves a contiguous
    message by zero-copy rendezvous; smaller ones share scatter-gather messages (UCX copies those through
    shared memory, but one message instead of many is what counts at that size)."""
    messages: list[tuple[int, list[tuple[int, int]]]] = []
    small: list[tuple[int, int]] = []
    for index, (address, length) in enumerate(ranges):
        if iov and length < min_zero_copy_bytes:
            small.append((address, length))
        else:
            messages.append((index, [(address, length)]))
    for group, chunk in enumerate(ucp_direct.chunks(small, max_ranges_per_message)):
        messages.append((_GROUP_TAG_BIT | group, list(chunk)))
    return messages


def merge_adjacent(first: np.ndarray, second: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge consecutive entries that continue each other on both sides: one message instead of many
    (the per-message cost dominates below a few hundred KiB). Vectorised: batches hold thousands."""
    continues = (first[1:] == first[:-1] + lengths[:-1]) & (second[1:] == second[:-1] + lengths[:-1])
    starts = np.flatnonzero(np.concatenate(([True], ~continues)))
    return first[starts], second[starts], np.add.reduceat(lengths, starts)


def batch_columns(first: Sequence[int], second: Sequence[int], lengths: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A caller's batch, checked, as int64 columns: each list is converted once, and a host write stays
    in numpy from here to the C put loop (converting back and forth cost about a millisecond per 1024
    ranges)."""
    if not (len(first) == len(second) == len(lengths)):
        raise ValueError(f"address and length lists differ in size: {len(first)}, {len(second)}, {len(lengths)}")
    if len(lengths) > MAX_RANGES_PER_BATCH:
        raise ValueError(f"a batch holds at most {MAX_RANGES_PER_BATCH} ranges, got {len(lengths)}")
    try:
        columns = tuple(np.asarray(values, dtype=np.int64) for values in (first, second, lengths))
    except OverflowError as exc:
        raise ValueError(f"an address or length of the batch is out of range: {exc}") from exc
    if not len(lengths) or bool((columns[2] <= 0).any()):
        raise ValueError("a batch needs at least one range, and every length must be positive")
    return columns  # type: ignore[return-value]
