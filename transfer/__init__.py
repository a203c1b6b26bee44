"""KV transfer between nodes: a Mooncake-shaped transfer engine over UCX, and the KV connector on top.

The names load on first use (PEP 562): importing one name (the transfer config, say) does not start UCX,
numpy and the engine's C put loop with it.
"""

from __future__ import annotations

from kvferry.lazy_names import lazy_names

_HOMES = {
    "TransferConfig": "kvferry.transfer.config",
    "TransferEngine": "kvferry.transfer.engine",
    "LayoutMismatchError": "kvferry.transfer.errors",
    "PeerUnreachableError": "kvferry.transfer.errors",
    "TransferError": "kvferry.transfer.errors",
    "TransferRejectedError": "kvferry.transfer.errors",
    "TransferRetriesExhaustedError": "kvferry.transfer.errors",
    "TransferTimeoutError": "kvferry.transfer.errors",
}

__all__ = sorted(_HOMES)

__getattr__ = lazy_names(__name__, _HOMES)
