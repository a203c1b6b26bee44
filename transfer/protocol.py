"""Control messages between transfer engines: length-prefixed JSON on one reserved UCX tag.

Data moves as tagged messages straight between registered buffers; control messages only say which
buffers. Every message is checked on arrival (kind, field types, sizes); anything malformed is dropped
and counted, never trusted.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CONTROL_TAG = 1 << 63  # data tags never set the top bit
CONTROL_BUFFER_BYTES = 256 * 1024
MAX_RANGES = 4096
_LENGTH = struct.Struct("<I")

# kind -> the fields it must carry, with their types. "ranges" travel packed (pack_ranges): a batch holds
# up to 4096, and as JSON lists they cost milliseconds to write, read and check on each side per write.
SCHEMAS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "hello": {"sender": str, "address": str, "op": int},
    "hello_ack": {"sender": str, "op": int},
    # timeout: the seconds the writer still waits for this write; the target holds it no longer.
    "write": {
        "sender": str, "address": str, "op": int, "tag_base": int, "ranges": str, "token": (str, type(None)), "iov": bool,
        "timeout": (int, float),
    },
    # rkeys: [[region address, packed remote key (hex)], ...] when the writer is to put (RMA), else [].
    "write_ready": {"sender": str, "op": int, "iov": bool, "rkeys": list},
    "write_complete": {"sender": str, "op": int},
    "write_reject": {"sender": str, "op": int, "reason": str},
    "write_done": {"sender": str, "op": int},
    # the writer gave up on a write the target accepted (retries exhausted, timed out): end it now
    "write_abort": {"sender": str, "op": int, "reason": str},
    # a prepared write's tagged data follows (writes.py): the target, idle in epoll meanwhile, now polls for it
    "write_data": {"sender": str, "op": int},
    # the writer gives up a prepared write before its data (writes.py): end it, the lease stays open
    "write_withdraw": {"sender": str, "op": int},
    "read": {"sender": str, "address": str, "op": int, "tag_base": int, "ranges": str, "iov": bool},
    "read_reject": {"sender": str, "op": int, "reason": str},
}
# Fields a kind may carry, checked when present: newer fields, so that a peer one version older still talks.
# eager: the writer sent its tagged messages with the request (writes.py); the target answers no write_ready.
# prepared: the data comes later (writes.py), so the target holds the write up to its prepared_hold_seconds.
OPTIONAL: dict[str, dict[str, type]] = {"write": {"eager": bool, "prepared": bool}}


class MalformedMessage(ValueError):
    pass


@dataclass(frozen=True)
class ControlMessage:
    kind: str
    fields: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]


def encode(kind: str, **fields: Any) -> bytes:
    payload = json.dumps({"kind": kind, **fields}, separators=(",", ":")).encode()
    if len(payload) + _LENGTH.size > CONTROL_BUFFER_BYTES:
        raise ValueError(f"control message of {len(payload)} bytes exceeds {CONTROL_BUFFER_BYTES}")
    return _LENGTH.pack(len(payload)) + payload


def pack_ranges(addresses: Sequence[int], lengths: Sequence[int]) -> str:
    """(address, length) pairs as base64 of little-endian uint64 pairs."""
    pairs = np.column_stack((np.asarray(addresses, dtype=np.uint64), np.asarray(lengths, dtype=np.uint64)))
    return base64.b64encode(pairs.astype("<u8").tobytes()).decode()


def _unpack_ranges(text: str) -> np.ndarray:
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedMessage("ranges are not base64") from None
    if len(raw) % 16:
        raise MalformedMessage(f"ranges hold {len(raw)} bytes, not (address, length) pairs of 8 bytes each")
    pairs = np.frombuffer(raw, dtype="<u8").reshape(-1, 2)
    if len(pairs) > MAX_RANGES:
        raise MalformedMessage(f"{len(pairs)} ranges exceed {MAX_RANGES}")
    if len(pairs) and int(pairs.max()) >= 1 << 63:  # no address or length is that large; int64 from here on
        raise MalformedMessage("a range address or length is beyond 2**63")
    return pairs.astype(np.int64)


def _typed(value: Any, expected: type | tuple[type, ...]) -> bool:
    # bool is an int to Python; an int field must not take True, nor a bool field 1.
    return isinstance(value, expected) and isinstance(value, bool) == (expected is bool)


def decode(buffer: bytes | memoryview) -> ControlMessage:
    if len(buffer) < _LENGTH.size:
        raise MalformedMessage("shorter than its length prefix")
    (length,) = _LENGTH.unpack_from(buffer)
    if length > len(buffer) - _LENGTH.size:
        raise MalformedMessage(f"claims {length} bytes, holds {len(buffer) - _LENGTH.size}")
    try:
        raw = json.loads(bytes(buffer[_LENGTH.size : _LENGTH.size + length]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedMessage(f"not JSON: {exc}") from None
    if not isinstance(raw, dict) or raw.get("kind") not in SCHEMAS:
        raise MalformedMessage(f"unknown kind {raw.get('kind') if isinstance(raw, dict) else raw!r}")
    kind = raw.pop("kind")
    for name, expected in SCHEMAS[kind].items():
        if not _typed(raw.get(name), expected):
            raise MalformedMessage(f"{kind}: field {name!r} missing or not {expected}")
    for name, expected in OPTIONAL.get(kind, {}).items():
        if name in raw and not _typed(raw[name], expected):
            raise MalformedMessage(f"{kind}: field {name!r} not {expected}")
    if "ranges" in raw:
        # As (address, length) tuples, and as columns for vectorised checks.
        pairs = _unpack_ranges(raw["ranges"])
        raw["range_columns"] = (pairs[:, 0], pairs[:, 1])
        raw["ranges"] = list(zip(pairs[:, 0].tolist(), pairs[:, 1].tolist(), strict=True))
    return ControlMessage(kind, raw)
