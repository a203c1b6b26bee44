"""KV transfer between nodes: a Mooncake-shaped transfer engine over UCX, and the KV connector on top.

The names load on first use (PEP 562): the router reads the node registry (kvferry.transfer.registry)
and must not start UCX, numpy and the engine's C put loop with it.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "TransferConfig": "kvferry.transfer.config",
    "TransferEngine": "kvferry.transfer.engine",
    "LayoutMismatchError": "kvferry.transfer.errors",
    "PeerUnreachableError": "kvferry.transfer.errors",
    "TransferError": "kvferry.transfer.errors",
    "TransferRejectedError": "kvferry.transfer.errors",
    "TransferRetriesExhaustedError": "kvferry.transfer.errors",
    "TransferTimeoutError": "kvferry.transfer.errors",
    "InMemoryRegistry": "kvferry.transfer.registry",
    "PeerRegistry": "kvferry.transfer.registry",
    "RedisRegistry": "kvferry.transfer.registry",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'kvferry.transfer' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
