"""KV transfer between nodes: a Mooncake-shaped transfer engine over UCX, and the KV connector on top."""

from kvferry.transfer.config import TransferConfig
from kvferry.transfer.engine import TransferEngine
from kvferry.transfer.errors import (
    LayoutMismatchError,
    PeerUnreachableError,
    TransferError,
    TransferRejectedError,
    TransferRetriesExhaustedError,
    TransferTimeoutError,
)
from kvferry.transfer.registry import InMemoryRegistry, PeerRegistry, RedisRegistry

__all__ = [
    "InMemoryRegistry",
    "LayoutMismatchError",
    "PeerRegistry",
    "PeerUnreachableError",
    "RedisRegistry",
    "TransferConfig",
    "TransferEngine",
    "TransferError",
    "TransferRejectedError",
    "TransferRetriesExhaustedError",
    "TransferTimeoutError",
]
