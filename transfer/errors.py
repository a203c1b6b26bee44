"""Typed transfer errors; each carries the status code a Mooncake-style caller expects."""

from __future__ import annotations


class TransferError(RuntimeError):
    status = -1


class PeerUnreachableError(TransferError):
    """The peer is not in the registry, or its endpoint failed (it died or restarted)."""

    status = -2


class TransferTimeoutError(TransferError):
    """The peer did not finish within the deadline; in-flight requests to it were cancelled."""

    status = -3


class TransferRejectedError(TransferError):
    """The peer refused the request (unregistered memory, unknown or expired token, bad message)."""

    status = -4


class LayoutMismatchError(TransferError):
    """Two KV pools disagree on a field that must match; the message names the field."""

    status = -5
