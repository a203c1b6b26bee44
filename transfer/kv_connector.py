"""Moves a request's KV blocks from a prefill node's pool into a decode node's pool.

The decode side reserves blocks and `expect`s them: that opens a lease (a token, the byte ranges of
exactly those blocks, a deadline) and returns a handle the router hands to the prefill side. The prefill
side `send_blocks`: it checks the two pools agree, pairs its blocks with the reserved ones, coalesces
runs that are contiguous on both sides into single messages, and writes them with the lease's token.
The lease is open before the prefill starts, so the prefill side may `prepare` the write then: the decode
side checks it and readies its memory while the KV is computed, and `send_blocks` starts the data at once
(transfer/prepared_write.py). The decode side's write guard accepts only writes inside an open lease;
when every reserved block has arrived the lease completes (the blocks become the request's), and a lease
that ends first is expired: its blocks are the caller's to free, and late writes for it are refused. A
write into the lease that fails (its writer gave up, timed out or died) ends the lease at once: no more of
its KV will come.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvferry.kvcache.compatibility import COMPATIBILITY_FIELDS
from kvferry.kvcache.kv_pool import KVPool
from kvferry.transfer.engine import TransferEngine
from kvferry.transfer.errors import LayoutMismatchError
from kvferry.transfer.prepared_write import PreparedWrite


def pool_description(model: str, pool: KVPool) -> dict[str, object]:
    return {"model": model, **pool.layout.as_dict()}


def register_pool(engine: TransferEngine, pool: KVPool) -> None:
    """A pool over memory the engine allocated (allocate_managed_buffer) is registered already."""
    tensor = pool.tensor
    length = tensor.numel() * tensor.element_size()
    if engine.memory.find(tensor.data_ptr(), length) is None:
        engine.register_memory(tensor.data_ptr(), length, tensor.device.index if tensor.is_cuda else None)


def check_compatible(local: dict[str, object], remote: dict[str, object], peer: str) -> None:
    for name in COMPATIBILITY_FIELDS:
        if local.get(name) != remote.get(name):
            raise LayoutMismatchError(
                f"KV pools of {peer!r} and this node differ in {name}: {remote.get(name)!r} there, {local.get(name)!r} here"
            )


def coalesce_block_runs(src_blocks: Sequence[int], dst_blocks: Sequence[int]) -> list[tuple[int, int, int]]:
    """(src_start, dst_start, count) for maximal runs consecutive on both sides, in order."""
    if len(src_blocks) != len(dst_blocks):
        raise ValueError(f"{len(src_blocks)} source blocks for {len(dst_blocks)} destination blocks")
    if not len(src_blocks):
        return []
    # Vectorised: an 8k-token prompt is 512 blocks, and a Python loop over them cost about 0.1 ms of the
    # write's critical path on a fast host (0.12 ms on a slow one).
    src, dst = np.asarray(src_blocks, dtype=np.int64), np.asarray(dst_blocks, dtype=np.int64)
    breaks = np.flatnonzero((np.diff(src) != 1) | (np.diff(dst) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    counts = np.diff(np.append(starts, len(src)))
    return list(zip(src[starts].tolist(), dst[starts].tolist(), counts.tolist(), strict=True))


@dataclass(frozen=True)
class DestinationHandle:
    """What the prefill side needs to write into reserved blocks (the router passes it along as JSON)."""

    node: str
    request_id: str
    token: str
    block_ids: list[int]
    # The decode side already holds this many leading blocks of the prompt (multi-turn): they don't travel.
    first_block: int
    pool: dict[str, object]
    base_address: int  # of the destination pool, to which block offsets are added
    address: str  # the decode node's UCX worker address (hex): the write needs no registry lookup
    lease_deadline: float  # time.time() on the decode node

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> DestinationHandle:
        return cls(**raw)  # type: ignore[arg-type]


@dataclass
class _Lease:
    request_id: str
    block_ids: list[int]
    ranges: list[tuple[int, int]]
    deadline: float
    missing: set[int] = field(default_factory=set)
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False


class KVReceiver:
    """The decode side: leases over reserved blocks, enforced by the engine's write guard."""

    def __init__(
        self,
        engine: TransferEngine,
        pool: KVPool,
        model: str,
        lease_seconds: float = 5.0,
        on_expired: Callable[[str, list[int]], None] | None = None,
        on_received: Callable[[int], None] | None = None,
        on_completed: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.pool = pool
        self.model = model
        self.lease_seconds = lease_seconds
        self.on_expired = on_expired
        # Called with the byte count of each write admitted into a lease, on the transfer engine's thread.
        self.on_received = on_received
        # Called with the request id once every reserved block of its lease arrived (transfer engine's thread).
        self.on_completed = on_completed
        self.block_bytes = pool.block_bytes()
        self.base = pool.tensor.data_ptr()
        self._leases: dict[str, _Lease] = {}
        self._lock = threading.Lock()
        self.stats = {"leases_expired": 0, "leases_completed": 0, "claims_expired": 0}
        register_pool(engine, pool)
        engine.write_guard = self._guard
        engine.on_write_finished = self._finished

    def expect(self, request_id: str, block_ids: list[int], first_block: int = 0) -> DestinationHandle:
        token = secrets.token_hex(16)
        ranges = [(self.base + src * self.block_bytes, count * self.block_bytes) for src, _, count in coalesce_block_runs(block_ids, block_ids)]
        lease = _Lease(request_id, list(block_ids), ranges, time.monotonic() + self.lease_seconds, set(block_ids))
        with self._lock:
            self._leases[token] = lease
        if not block_ids:  # this node holds the whole prompt already: nothing will travel
            lease.ok = True
            lease.done.set()
        return DestinationHandle(
            node=self.engine.local_name,
            request_id=request_id,
            token=token,
            block_ids=list(block_ids),
            first_block=first_block,
            pool=pool_description(self.model, self.pool),
            base_address=self.base,
            address=self.engine.address.hex(),
            lease_deadline=time.time() + self.lease_seconds,
        )

    def wait(self, handle: DestinationHandle, timeout: float | None = None) -> bool:
        """True once every reserved block arrived; False when the lease ended first (blocks are then
        reported through on_expired and the caller frees them)."""
        lease = self._leases.get(handle.token)
        if lease is None:
            return False
        remaining = lease.deadline - time.monotonic()
        wait_for = remaining if timeout is None else min(timeout, remaining)
        if not lease.done.wait(max(0.0, wait_for)) or not lease.ok:
            self.expire_due()  # ended by time, or by a write that failed (its deadline is now)
        return lease.ok

    def release(self, handle: DestinationHandle) -> None:
        """Forget a lease (completed and consumed, or aborted): later writes for it are refused."""
        with self._lock:
            self._leases.pop(handle.token, None)

    def open_leases(self) -> int:
        """Leases waiting for KV or for their claim (a leak check: 0 on an idle node)."""
        with self._lock:
            return len(self._leases)

    def claim(self, handle: DestinationHandle) -> bool:
        """Take a completed lease's blocks for decoding: True once, and only if every block arrived and
        the lease has not ended. Atomic with expiry, so blocks are either claimed or freed, never both."""
        with self._lock:
            lease = self._leases.get(handle.token)
            if lease is None or not lease.ok:
                return False
            del self._leases[handle.token]
            return True

    def expire_due(self) -> list[str]:
        """End every lease past its deadline, completed ones that nobody claimed too (the router died,
        or the client left between prefill and decode); returns their request ids."""
        now = time.monotonic()
        with self._lock:
            due = [(token, lease) for token, lease in self._leases.items() if lease.deadline <= now]
            for token, _ in due:
                del self._leases[token]
        for _, lease in due:
            self.stats["leases_expired" if not lease.ok else "claims_expired"] += 1
            lease.done.set()
            if self.on_expired is not None:
                self.on_expired(lease.request_id, lease.block_ids)
        return [lease.request_id for _, lease in due]

    def _guard(self, token: str | None, ranges: list[tuple[int, int]]) -> str | None:
        with self._lock:
            lease = self._leases.get(token or "")
            if lease is None or lease.ok or lease.deadline <= time.monotonic():
                return "unknown, completed or expired lease token"
            for address, length in ranges:
                if not any(start <= address and address + length <= start + size for start, size in lease.ranges):
                    return f"range {address:#x}+{length} is outside the blocks reserved for {lease.request_id}"
            return None

    def _finished(self, token: str | None, ranges: list[tuple[int, int]], ok: bool) -> None:
        with self._lock:
            lease = self._leases.get(token or "")
            if lease is None or lease.ok or lease.deadline <= time.monotonic():
                return  # ended already: expire_due frees its blocks
            if not ok:
                # The writer gave up, died or timed out: no more of this KV will come, so the lease ends
                # now rather than at its deadline (the next expire_due frees its blocks; wait() returns).
                lease.deadline = time.monotonic()
                lease.done.set()
                return
            for address, length in ranges:  # inside the lease: the guard admitted nothing else
                first = (address - self.base) // self.block_bytes
                lease.missing.difference_update(range(first, first + length // self.block_bytes))
            if self.on_received is not None:
                self.on_received(sum(length for _, length in ranges))
            if lease.missing:
                return
            lease.ok = True
            # The KV is here; the decode call must now claim it within another lease period.
            lease.deadline = time.monotonic() + self.lease_seconds
        self.stats["leases_completed"] += 1
        lease.done.set()
        if self.on_completed is not None:
            self.on_completed(lease.request_id)


class KVSender:
    """The prefill side: sends a request's blocks straight from its pool into the reserved ones."""

    def __init__(self, engine: TransferEngine, pool: KVPool, model: str) -> None:
        self.engine = engine
        self.pool = pool
        self.model = model
        self.block_bytes = pool.block_bytes()
        self.base = pool.tensor.data_ptr()
        self.description = pool_description(model, pool)
        register_pool(engine, pool)

    def handshake(self, peer: str) -> None:
        """Check that `peer` answers and that its published pool matches ours (errors name the field)."""
        record = self.engine.registry.lookup(peer) or {}
        check_compatible(self.description, record.get("pool", {}), peer)  # type: ignore[arg-type]
        self.engine.handshake(peer)

    def prepare(self, handle: DestinationHandle) -> PreparedWrite | None:
        """Request the write into the handle's blocks before their KV exists (the prefill about to compute
        it); send_blocks with the result starts the data at once. None when nothing will travel. It waits
        for its data until the lease ends; withdraw it if the prefill fails."""
        check_compatible(self.description, handle.pool, handle.node)
        runs = coalesce_block_runs(handle.block_ids, handle.block_ids)
        if not runs:
            return None
        return self.engine.prepare_write(
            handle.node, [handle.base_address + d * self.block_bytes for _, d, _ in runs],
            [count * self.block_bytes for _, _, count in runs], token=handle.token,
            target_address=bytes.fromhex(handle.address), source_on_device=self.pool.tensor.is_cuda,
            hold_seconds=max(1.0, handle.lease_deadline - time.time()),
        )

    def send_blocks(self, request_id: str, src_block_ids: Sequence[int], handle: DestinationHandle,
                    prepared: PreparedWrite | None = None) -> int:  # fmt: skip
        """Write the prompt's blocks from `handle.first_block` on; returns the bytes sent. With the handle's
        prepared write, its data goes at once where the blocks fit the runs prepared, one source run per
        destination run, or where they do not (blocks from the prefix cache, say) but the write goes as puts
        (host memory); else it is withdrawn and an ordinary write follows."""
        try:
            if handle.request_id != request_id:
                raise ValueError(f"handle is for request {handle.request_id!r}, not {request_id!r}")
            check_compatible(self.description, handle.pool, handle.node)
            runs = coalesce_block_runs(list(src_block_ids)[handle.first_block :], handle.block_ids)
        except BaseException:
            if prepared is not None:  # refused before any byte: end the prepared write now, not at its hold
                prepared.withdraw()
            raise
        if not runs:
            return 0
        src_addrs = [self.base + s * self.block_bytes for s, _, _ in runs]
        lengths = [count * self.block_bytes for _, _, count in runs]
        dst_addrs = [handle.base_address + d * self.block_bytes for _, d, _ in runs]
        if prepared is not None:
            if prepared.ranges == len(runs):  # the source runs split no destination run
                prepared.send(src_addrs).result()
                return sum(lengths)
            if prepared.puts:  # puts land anywhere in the ranges prepared
                prepared.send(src_addrs, dst_addrs, lengths).result()
                return sum(lengths)
            prepared.withdraw()
        self.engine.batch_transfer_write(
            handle.node, src_addrs, dst_addrs, lengths, token=handle.token, target_address=bytes.fromhex(handle.address)
        )
        return sum(lengths)
