"""Transfer settings: one frozen model, shared by the engine and the KV connector."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransferConfig:
    # A batch that has not completed by then fails and its requests are cancelled (receiver dead,
    # peer stalled); KV blocks pinned for it are released by the caller.
    timeout_seconds: float = 2.0
    # Host writes: ranges whose put (or the flush after them) UCX answered with an error are put again,
    # those alone, on a new endpoint, at most this many times and within timeout_seconds; then the write
    # fails with TransferRetriesExhaustedError. 0 fails at the first error.
    max_retries: int = 2
    # First contact with a peer (hello / hello_ack); a closed peer fails within this.
    handshake_timeout_seconds: float = 1.0
    # How long the loop sleeps in epoll when nothing is in flight; bounds the latency of a submit.
    idle_wait_ms: int = 1
    # With no UCP request of its own in flight, the loop polls first reply_poll_seconds after the last
    # activity, then twice as long each time up to reply_poll_max_seconds, and sleeps in epoll once
    # nothing is awaited: UCX's shared-memory transports cannot wake an epoll sleeper (a reply or a
    # write came up to idle_wait_ms late), and a spinning target took a core from the writer, whose
    # process does the copying (2-core hosts).
    reply_poll_seconds: float = 50e-6
    reply_poll_max_seconds: float = 400e-6
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
