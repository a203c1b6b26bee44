"""Transfer settings: one frozen model, shared by the engine and the KV connector."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransferConfig:
    # A batch that has not completed by then fails and its requests are cancelled (receiver dead,
    # peer stalled); KV blocks pinned for it are released by the caller.
    timeout_seconds: float = 2.0
    # First contact with a peer (hello / hello_ack); a closed peer fails within this.
    handshake_timeout_seconds: float = 1.0
    # How long the loop sleeps in epoll when nothing is in flight; bounds the latency of a submit.
    idle_wait_ms: int = 1
    # How often the engine refreshes its registry record (whose TTL is longer).
    heartbeat_seconds: float = 5.0
    # UCX 1.21 moves a scatter-gather message by zero-copy rendezvous (the receiver pulls the sender's
    # ranges through CMA or RDMA READ) only up to a small number of entries; past that it falls back to
    # eager copies through shared memory in 8 KiB fragments, several times slower. Host-memory batches
    # are cut into messages of at most this many ranges.
    max_ranges_per_message: int = 16
    # Control receives kept posted, so that several peers can talk at once.
    control_receives: int = 8
