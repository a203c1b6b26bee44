"""Typed transfer errors; each carries the status code a Mooncake-style caller expects, and the cause a
node's `kvferry:kv_transfer_failures_total{reason}` counts it under."""

from __future__ import annotations


class TransferError(RuntimeError):
    status = -1
    reason = "failed"


class PeerUnreachableError(TransferError):
    """The peer is not in the registry, or its endpoint failed (it died or restarted)."""

    status = -2
    reason = "peer_unreachable"


class TransferRetriesExhaustedError(TransferError):
    """Ranges of a write still did not land after the configured retries (UCX answered puts or their
    flush with an error each time); the message names the peer, the attempts and UCX's error."""

    status = -6
    reason = "retries_exhausted"

    def __init__(self, peer: str, attempts: int, reason: str) -> None:
        super().__init__(f"write to {peer!r} failed after {attempts} attempts: {reason}")
        self.peer = peer
        self.attempts = attempts


class TransferTimeoutError(TransferError):
    """The peer did not finish within the deadline; in-flight requests to it were cancelled."""

    status = -3
    reason = "timeout"


class TransferRejectedError(TransferError):
    """The peer refused the request (unregistered memory, unknown or expired token, bad message)."""

    status = -4
    reason = "rejected"


class LayoutMismatchError(TransferError):
    """Two KV pools disagree on a field that must match; the message names the field."""

    status = -5
