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

This class is the API and the wiring; each job is a module of its own: the loop thread (loop.py), this
engine's memory (local_memory.py), its registry record (record.py), endpoints to peers (peers.py),
control messages (control.py), the operations it started (outbound.py: writes.py with puts.py, reads.py,
hello.py) and those peers started here (inbound.py).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from kvferry.kvcache.node_registry import PeerRegistry, registry_from
from kvferry.transfer.batch import MAX_RANGES_PER_BATCH, batch_columns, merge_adjacent
from kvferry.transfer.config import TransferConfig
from kvferry.transfer.control import ControlChannel
from kvferry.transfer.data_messages import DataMessages
from kvferry.transfer.errors import TransferError
from kvferry.transfer.hello import Hellos
from kvferry.transfer.inbound import Inbound, WriteGuard, WriteListener
from kvferry.transfer.local_memory import LocalMemory
from kvferry.transfer.loop import EngineLoop, run_safely
from kvferry.transfer.memory import MemoryRegistry
from kvferry.transfer.outbound import OutboundOps
from kvferry.transfer.peers import Peers
from kvferry.transfer.prepared_write import PreparedWrite
from kvferry.transfer.protocol import ControlMessage
from kvferry.transfer.puts import Puts
from kvferry.transfer.reads import Reads
from kvferry.transfer.record import RecordPublisher
from kvferry.transfer.ucx import UcxWorker
from kvferry.transfer.writes import Writes

# The batch limit is named here too, where callers of the engine look for it (benchmarks/transfer_peers/).
__all__ = ["MAX_RANGES_PER_BATCH", "TransferEngine"]

PROTOCOLS = ("ucx",)


class TransferEngine:
    def __init__(self, config: TransferConfig | None = None) -> None:
        self.config = config or TransferConfig()
        self.memory = MemoryRegistry()
        self.write_guard: WriteGuard | None = None
        self.on_write_finished: WriteListener | None = None
        self.stats = {
            "malformed_messages": 0, "unauthenticated_messages": 0, "duplicate_messages": 0, "bytes_sent": 0,
            # requests this engine refused (memory not registered here, a write guard's no, a duplicate)
            "rejected_writes": 0, "rejected_reads": 0,
            # puts issued (retried ones again), and attempts after a first one that did not all land
            "puts": 0, "put_retries": 0,
            # of those puts, plain copies into a peer's shared memory attached here (ucp_direct.put_many)
            "puts_copied": 0,
            # writes into this engine's memory: completed (each told to the listener once), aborted by the writer
            "writes_received": 0, "bytes_received": 0, "aborted_writes": 0,
            # prepared writes (prepare_write) their writer withdrew before any data: ended, not failed
            "withdrawn_writes": 0,
        }
        self.local_name = ""
        self.worker: UcxWorker | None = None
        self._closing = threading.Event()
        self._loop = EngineLoop(self._closing, self.config.idle_wait_ms, self.config.reply_spin_us)
        self._record: RecordPublisher | None = None

    # ---- Mooncake-shaped API ----------------------------------------------------------------
    def initialize(
        self, local_name: str, metadata: str | PeerRegistry, protocol_name: str = "ucx", **record: object
    ) -> int:
        if protocol_name not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS} (UCX picks shm, CMA, TCP, RDMA or CUDA IPC)")
        self.local_name = local_name
        self.registry = registry_from(metadata)
        worker = self._start_worker()
        self.address = worker.address
        self._record = RecordPublisher(self.registry, local_name, self.address, self.config.heartbeat_seconds, self._closing)
        self._record.start(record)
        self._wire(worker)
        self._loop.start(f"kvferry-transfer-{local_name}", worker, self._turn, self._awaiting_reply, self._finish)
        return 0

    def publish(self, **record: object) -> None:
        """(Re)publish this engine's record: its worker address plus whatever the caller adds."""
        self._initialized_record().publish(**record)

    def update_record(self, **fields: object) -> None:
        """Merge `fields` into the record the heartbeat publishes (a node's load), and publish it now."""
        self._initialized_record().update(**fields)

    def register_memory(self, address: int, length: int, cuda_device: int | None = None) -> int:
        """Host memory (`cuda_device` None) is also mapped for RMA, so that peers can put into it; device
        memory moves by tagged messages through CUDA IPC (local_memory.py says why its GPU becomes current
        on the loop thread)."""
        self._loop.call(lambda: self._local_memory.register(address, length, cuda_device))
        return 0

    def allocate_managed_buffer(self, length: int) -> int:
        """Host memory allocated and registered by UCX (Mooncake's call of the same name): the address
        of at least `length` bytes. A writer on the same host puts into it by copying into the shared
        segment it attached (System V or POSIX shared memory), with no system call per 512 KiB as into
        memory from register_memory (CMA); across hosts it is RDMA memory like any other. Free it with
        free_managed_buffer; it is gone when the process ends either way."""
        self._start_worker()  # before initialize: the node allocates its pool before it starts the engine
        allocated: list[int] = []
        self._loop.call(lambda: allocated.append(self._local_memory.allocate(length)))
        return allocated[0]

    def free_managed_buffer(self, address: int, length: int = 0) -> int:
        """Unmaps and frees memory from allocate_managed_buffer (`length` is Mooncake's, not needed)."""
        return self.unregister_memory(address)

    def unregister_memory(self, address: int) -> int:
        self._loop.call(lambda: self._local_memory.unregister(address))
        return 0

    def batch_transfer_write_async(
        self, target: str, src_addrs: list[int], dst_addrs: list[int], lengths: list[int],
        token: str | None = None, target_address: bytes | None = None,
    ) -> Future[int]:
        """`target_address`: the target's worker address, where the caller has it from the target itself
        (a destination handle): the write then skips the registry lookup, a Redis round trip."""
        src, dst, sizes = merge_adjacent(*batch_columns(src_addrs, dst_addrs, lengths))
        future: Future[int] = Future()
        self._loop.submit(lambda: self._writes.start(target, src, dst, sizes, token, target_address, future))
        return future

    def prepare_write(
        self, target: str, dst_addrs: list[int], lengths: list[int], token: str | None = None,
        target_address: bytes | None = None, source_on_device: bool = False, hold_seconds: float | None = None,
    ) -> PreparedWrite:
        """Request a write before its data exists: the target checks the destination ranges (and its write
        guard) now, and `send` on the handle later starts the data without that exchange (`puts` on the handle,
        once the target answered, says whether it takes other ranges than these). The write waits
        for its data at most `hold_seconds` (timeout_seconds by default; at most the config's
        prepared_hold_seconds), then fails as timed out; after `send` it has timeout_seconds."""
        dst, _, sizes = batch_columns(dst_addrs, dst_addrs, lengths)
        hold = min(self.config.prepared_hold_seconds, hold_seconds or self.config.timeout_seconds)
        future: Future[int] = Future()
        op_id = self._outbound.new_id()
        prepared = PreparedWrite(
            future, len(sizes), lambda src, dst, lens: self._loop.submit(lambda: self._writes.send_prepared(op_id, src, dst, lens)),
            lambda: self._loop.submit(lambda: self._writes.withdraw(op_id)),
        )  # fmt: skip
        self._loop.submit(lambda: self._writes.prepare(target, dst, sizes, token, target_address, source_on_device,
                                                       hold, op_id, future, prepared.mark_ready))  # fmt: skip
        return prepared

    def batch_transfer_write(
        self, target: str, src_addrs: list[int], dst_addrs: list[int], lengths: list[int],
        token: str | None = None, target_address: bytes | None = None,
    ) -> int:
        future = self.batch_transfer_write_async(target, src_addrs, dst_addrs, lengths, token, target_address)
        return future.result()

    def batch_transfer_read_async(
        self, target: str, local_addrs: list[int], remote_addrs: list[int], lengths: list[int]
    ) -> Future[int]:
        local, remote, sizes = (column.tolist() for column in merge_adjacent(*batch_columns(local_addrs, remote_addrs, lengths)))
        future: Future[int] = Future()
        self._loop.submit(lambda: self._reads.start(target, local, remote, sizes, future))
        return future

    def batch_transfer_read(self, target: str, local_addrs: list[int], remote_addrs: list[int], lengths: list[int]) -> int:
        return self.batch_transfer_read_async(target, local_addrs, remote_addrs, lengths).result()

    def handshake(self, target: str) -> int:
        """Check that `target` answers; fails within the handshake timeout for a closed peer."""
        future: Future[int] = Future()
        self._loop.submit(lambda: self._hellos.start(target, future))
        return future.result()

    def in_flight(self) -> int:
        """Operations not finished yet, either way (a leak check: 0 once every transfer ended)."""
        return len(self._outbound) + len(self._inbound) if self._loop.started else 0

    def close(self) -> None:
        self._loop.close()
        if self._record is not None and self.local_name:
            self._record.remove()

    # ---- the parts and the loop's turn ------------------------------------------------------
    def _start_worker(self) -> UcxWorker:
        """Once: at initialize, or before it when a host pool is allocated first (LLMEngine's pool_allocator)."""
        if self.worker is None:
            self.worker = UcxWorker({"CMA_TX_QUOTA": str(self.config.cma_segments_per_progress)})
            self._local_memory = LocalMemory(self.worker, self.memory)
        return self.worker

    def _wire(self, worker: UcxWorker) -> None:
        config, stats, memory = self.config, self.stats, self.memory
        self._peers = Peers(worker, self.registry)
        self._control = ControlChannel(worker, self._peers, self.local_name, config.control_receives, stats,
                                       self._closing, self._dispatch, config.cluster_token)
        data = DataMessages(worker, memory, config)
        self._outbound = OutboundOps(self._peers, stats)
        puts = Puts(worker, self._peers, stats, config.max_retries)
        self._writes = Writes(self._outbound, self._control, self._peers, puts, data, memory, config, self.address)
        self._reads = Reads(self._outbound, self._control, self._peers, data, memory, config, self.address)
        self._hellos = Hellos(self._outbound, self._control, self._peers, config.handshake_timeout_seconds, self.address)
        self._inbound = Inbound(self._control, self._peers, data, memory, config, stats, self._judge_write,
                                self._tell_write_finished)
        self._handlers = {
            "hello": self._hellos.on_hello, "hello_ack": self._hellos.on_hello_ack,
            "write": self._inbound.on_write, "write_ready": self._writes.on_write_ready,
            "write_complete": self._inbound.on_write_complete, "write_reject": self._writes.on_write_reject,
            "write_done": self._writes.on_write_done, "write_abort": self._inbound.on_write_abort,
            "write_data": self._inbound.on_write_data, "write_withdraw": self._inbound.on_write_withdraw,
            "read": self._inbound.on_read, "read_reject": self._reads.on_read_reject,
        }

    def _dispatch(self, message: ControlMessage) -> None:
        self._handlers[message.kind](message)

    def _turn(self) -> bool:
        """The messages that arrived, then every operation; True while requests of ours are in flight."""
        run_safely(self._control.poll)
        now = time.monotonic()
        self._outbound.poll(now)
        self._inbound.poll(now)
        return self._outbound.busy() or self._inbound.busy()

    def _awaiting_reply(self) -> bool:
        return len(self._outbound) > 0

    def _finish(self) -> None:
        self._outbound.fail_all(TransferError("transfer engine closed"))
        self._peers.release_remote_keys()

    def _judge_write(self, token: str | None, ranges: list[tuple[int, int]]) -> str | None:
        return self.write_guard(token, ranges) if self.write_guard is not None else None

    def _tell_write_finished(self, token: str | None, ranges: list[tuple[int, int]], ok: bool) -> None:
        if self.on_write_finished is not None:
            self.on_write_finished(token, ranges, ok)

    def _initialized_record(self) -> RecordPublisher:
        if self._record is None:
            raise RuntimeError("the transfer engine publishes its record once initialized")
        return self._record
