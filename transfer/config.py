"""Transfer settings: one frozen model, shared by the engine and the KV connector."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TransferConfig:
    # A batch that has not completed by then fails and its requests are cancelled (receiver dead,
    # peer stalled); KV blocks pinned for it are released by the caller.
    timeout_seconds: float = 2.0
    # Host writes: ranges whose put (or the flush after them) UCX answered with an error are put again,
    # those alone, on a new endpoint, at most this many times and within timeout_seconds; then the write
    # fails with TransferRetriesExhaustedError. 0 fails at the first error.
    max_retries: int = 2
    # A prepared write (TransferEngine.prepare_write: requested while the prefill still computes its data)
    # waits for its data at most as long as its writer asks, and a target holds one no longer than this.
    prepared_hold_seconds: float = 30.0
    # First contact with a peer (hello / hello_ack); a closed peer fails within this.
    handshake_timeout_seconds: float = 1.0
    # The loop sleeps in epoll whenever it has no UCP request of its own in flight; a peer's message or
    # a submitted command wakes it at once, and this bounds how late it sees a deadline pass.
    idle_wait_ms: int = 1
    # While an operation of ours awaits a peer's reply (a write its write_done), the loop keeps progressing
    # the worker for up to this long after its last request completed instead of sleeping in epoll: the
    # reply is then taken as it arrives, not after the kernel has woken the thread. Host writes between two
    # processes on 2 cores: 0.98 -> 0.82 ms a 64 KiB write (docs/transfer.md, item 11). 0: sleep at once.
    reply_spin_us: int = 500
    # Segments (512 KiB at most) UCX's CMA transport may copy per worker progress call (its
    # CMA_TX_QUOTA, default 1): with 1, every put of a batch costs one turn of the engine loop (tens of
    # microseconds of Python); 64 KiB blocks then moved at a third of memcpy.
    cma_segments_per_progress: int = 1024
    # How often the engine refreshes its registry record (whose TTL is longer).
    heartbeat_seconds: float = 5.0
    # Tagged messages (reads, and writes involving device memory; host-to-host writes are puts): small
    # host ranges share scatter-gather messages of at most this many ranges (UCX 1.21 copies those
    # through shared memory in fragments; fewer entries keep its pipeline short).
    max_ranges_per_message: int = 16
    # Tagged messages: ranges at least this long travel as their own contiguous message, which UCX moves
    # by zero-copy rendezvous (a CMA read on one host); below it the per-message cost wins over the copy.
    min_zero_copy_bytes: int = 64 * 1024
    # Control receives kept posted, so that several peers can talk at once.
    control_receives: int = 8
    # The cluster token: peers talk only with peers that have it (control.py); None: any peer may.
    cluster_token: str | None = field(default=None, repr=False)
