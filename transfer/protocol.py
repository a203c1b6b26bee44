"""Control messages between transfer engines: length-prefixed JSON on one reserved UCX tag.

Data moves as tagged messages straight between registered buffers; control messages only say which
buffers. Every message is checked on arrival (kind, field types, sizes); anything malformed is dropped
and counted, never trusted.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

CONTROL_TAG = 1 << 63  # data tags never set the top bit
CONTROL_BUFFER_BYTES = 256 * 1024
MAX_RANGES = 4096
_LENGTH = struct.Struct("<I")

# kind -> the fields it must carry, with their types
SCHEMAS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "hello": {"sender": str, "address": str, "op": int},
    "hello_ack": {"sender": str, "op": int},
    # timeout: the seconds the writer still waits for this write; the target holds it no longer.
    "write": {
        "sender": str, "address": str, "op": int, "tag_base": int, "ranges": list, "token": (str, type(None)), "iov": bool,
        "timeout": (int, float),
    },
    # rkeys: [[region address, packed remote key (hex)], ...] when the writer is to put (RMA), else [].
    "write_ready": {"sender": str, "op": int, "iov": bool, "rkeys": list},
    "write_complete": {"sender": str, "op": int},
    "write_reject": {"sender": str, "op": int, "reason": str},
    "write_done": {"sender": str, "op": int},
    # the writer gave up on a write the target accepted (retries exhausted, timed out): end it now
    "write_abort": {"sender": str, "op": int, "reason": str},
    "read": {"sender": str, "address": str, "op": int, "tag_base": int, "ranges": list, "iov": bool},
    "read_reject": {"sender": str, "op": int, "reason": str},
}


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


def _check_ranges(ranges: list[Any]) -> None:
    if len(ranges) > MAX_RANGES:
        raise MalformedMessage(f"{len(ranges)} ranges exceed {MAX_RANGES}")
    for item in ranges:
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(v, int) and v >= 0 for v in item)):
            raise MalformedMessage(f"a range must be [address, length] of non-negative ints, got {item!r}")


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
        value = raw.get(name)
        # bool is an int to Python; an int field must not take True, nor a bool field 1.
        if not isinstance(value, expected) or isinstance(value, bool) != (expected is bool):
            raise MalformedMessage(f"{kind}: field {name!r} missing or not {expected}")
    if "ranges" in raw:
        _check_ranges(raw["ranges"])
    return ControlMessage(kind, raw)
