"""The UCP calls ucxx does not expose, bound with ctypes: scatter-gather tagged messages, and one-sided
RMA (memory maps, remote keys, put, flush).

Through ucxx every range is a tagged message with Python objects around it, tens of microseconds each,
and ucxx has no put at all. These calls go to the same libucp that ucxx loaded, on ucxx's context,
worker and endpoint handles, from the transfer loop's thread, so UCX sees one single-threaded user.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import libucx
import numpy as np

from kvferry.native_library import NativeLibrary

_UCP = ctypes.CDLL(os.path.join(os.path.dirname(libucx.__file__), "lib", "libucp.so"))
_UCP.ucp_tag_send_nbx.restype = ctypes.c_void_p
_UCP.ucp_tag_send_nbx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_void_p]
_UCP.ucp_tag_recv_nbx.restype = ctypes.c_void_p
_UCP.ucp_tag_recv_nbx.argtypes = [
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p,
]
_UCP.ucp_request_check_status.restype = ctypes.c_int
_UCP.ucp_request_check_status.argtypes = [ctypes.c_void_p]
_UCP.ucp_request_free.argtypes = [ctypes.c_void_p]
_UCP.ucp_request_cancel.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
_UCP.ucp_put_nbx.restype = ctypes.c_void_p
_UCP.ucp_put_nbx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p]
_UCP.ucp_ep_flush_nbx.restype = ctypes.c_void_p
_UCP.ucp_ep_flush_nbx.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
_UCP.ucp_mem_map.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
_UCP.ucp_mem_unmap.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
_UCP.ucp_mem_query.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
_UCP.ucp_rkey_pack.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
_UCP.ucp_rkey_buffer_release.argtypes = [ctypes.c_void_p]
_UCP.ucp_ep_rkey_unpack.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
_UCP.ucp_rkey_destroy.argtypes = [ctypes.c_void_p]
_UCP.ucp_rkey_ptr.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_void_p)]
_UCP.ucp_worker_signal.argtypes = [ctypes.c_void_p]
_UCP.ucs_status_string.restype = ctypes.c_char_p
_UCP.ucs_status_string.argtypes = [ctypes.c_int]
# The C put loop: one put path, not a slower copy of it in Python to fall back on.
_BATCH = NativeLibrary(Path(__file__).with_name("_ucp_batch.c"), "kvferry.transfer's put loop").load()
_BATCH.kvf_put_many.restype = ctypes.c_int64
_BATCH.kvf_put_many.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_size_t] + [ctypes.c_void_p] * 6
_BATCH.kvf_copy_many.restype = None
_BATCH.kvf_copy_many.argtypes = [ctypes.c_size_t] + [ctypes.c_void_p] * 3
_BATCH.kvf_copy_two.restype = None
_BATCH.kvf_copy_two.argtypes = ([ctypes.c_size_t] + [ctypes.c_void_p] * 3) * 2
# Copies of at least this many bytes in one batch run on two threads (kvf_copy_two): starting a thread
# costs tens of microseconds, a tenth of what the second thread saves on 2 MiB.
PARALLEL_COPY_BYTES = 2 << 20
_PUT_NBX = ctypes.cast(_UCP.ucp_put_nbx, ctypes.c_void_p).value
_REQUEST_FREE = ctypes.cast(_UCP.ucp_request_free, ctypes.c_void_p).value
Column = Sequence[int] | np.ndarray  # one field of a batch of puts

UCS_OK, UCS_INPROGRESS, UCS_ERR_LAST = 0, 1, -100
UCP_OP_ATTR_FIELD_DATATYPE = 1 << 3
UCP_OP_ATTR_FIELD_MEMORY_TYPE = 1 << 6
UCP_DATATYPE_IOV = 2
UCS_MEMORY_TYPE_CUDA = 1
FULL_MASK = (1 << 64) - 1


class _Iov(ctypes.Structure):
    _fields_ = [("buffer", ctypes.c_void_p), ("length", ctypes.c_size_t)]


class _RequestParam(ctypes.Structure):
    """ucp_request_param_t of UCX 1.21 (ucp/api/ucp.h); only op_attr_mask and datatype are set."""

    _fields_ = [
        ("op_attr_mask", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("request", ctypes.c_void_p),
        ("cb", ctypes.c_void_p),
        ("datatype", ctypes.c_uint64),
        ("user_data", ctypes.c_void_p),
        ("reply_buffer", ctypes.c_void_p),
        ("memory_type", ctypes.c_int),
        ("recv_info", ctypes.c_void_p),
        ("memh", ctypes.c_void_p),
    ]


_IOV_PARAM = _RequestParam(op_attr_mask=UCP_OP_ATTR_FIELD_DATATYPE, datatype=UCP_DATATYPE_IOV)
_CONTIG_PARAM = _RequestParam(op_attr_mask=0)  # contiguous bytes, UCP's default datatype
_CUDA_PARAM = _RequestParam(op_attr_mask=UCP_OP_ATTR_FIELD_MEMORY_TYPE, memory_type=UCS_MEMORY_TYPE_CUDA)


class UcpError(RuntimeError):
    pass


class _MemMapParams(ctypes.Structure):
    """ucp_mem_map_params_t of UCX 1.21; address and length are set."""

    _fields_ = [
        ("field_mask", ctypes.c_uint64),
        ("address", ctypes.c_void_p),
        ("length", ctypes.c_size_t),
        ("flags", ctypes.c_uint),
        ("prot", ctypes.c_uint),
        ("memory_type", ctypes.c_int),
        ("exported_memh_buffer", ctypes.c_void_p),
    ]


class _MemAttr(ctypes.Structure):
    """ucp_mem_attr_t of UCX 1.21 (ucp/api/ucp_def.h)."""

    _fields_ = [("field_mask", ctypes.c_uint64), ("address", ctypes.c_void_p), ("length", ctypes.c_size_t), ("mem_type", ctypes.c_int)]


_MEM_MAP_ADDRESS_AND_LENGTH = (1 << 0) | (1 << 1)
_MEM_MAP_FIELD_FLAGS = 1 << 2
_MEM_MAP_ALLOCATE = 1 << 1
_MEM_ATTR_ADDRESS_AND_LENGTH = (1 << 0) | (1 << 1)


def _check(status: int, what: str) -> None:
    if status != UCS_OK:
        raise UcpError(f"{what}: {_UCP.ucs_status_string(status).decode()}")


def map_memory(context_handle: int, address: int, length: int) -> tuple[int, bytes]:
    """Register existing memory for RMA; returns (memory handle, packed remote key for peers)."""
    params = _MemMapParams(field_mask=_MEM_MAP_ADDRESS_AND_LENGTH, address=address, length=length)
    memh = ctypes.c_void_p()
    _check(_UCP.ucp_mem_map(context_handle, ctypes.byref(params), ctypes.byref(memh)), "ucp_mem_map")
    return int(memh.value), _pack_rkey(context_handle, memh)  # type: ignore[arg-type]


def allocate_memory(context_handle: int, length: int) -> tuple[int, int, int, bytes]:
    """Memory UCX allocates for RMA, by its ALLOC_PRIO (System V shared memory first, then POSIX):
    returns (memory handle, address, length, packed remote key). A peer on the same host attaches such
    a segment, and its puts into it are plain copies in its own process instead of one
    process_vm_writev per 512 KiB (CMA). The length may be rounded up."""
    params = _MemMapParams(field_mask=_MEM_MAP_ADDRESS_AND_LENGTH | _MEM_MAP_FIELD_FLAGS, address=None, length=length, flags=_MEM_MAP_ALLOCATE)
    memh = ctypes.c_void_p()
    _check(_UCP.ucp_mem_map(context_handle, ctypes.byref(params), ctypes.byref(memh)), "ucp_mem_map(ALLOCATE)")
    attr = _MemAttr(field_mask=_MEM_ATTR_ADDRESS_AND_LENGTH)
    status = _UCP.ucp_mem_query(memh, ctypes.byref(attr))
    if status != UCS_OK:
        _UCP.ucp_mem_unmap(context_handle, memh)
        _check(status, "ucp_mem_query")
    return int(memh.value), int(attr.address), int(attr.length), _pack_rkey(context_handle, memh)  # type: ignore[arg-type]


def _pack_rkey(context_handle: int, memh: ctypes.c_void_p) -> bytes:
    packed, size = ctypes.c_void_p(), ctypes.c_size_t()
    _check(_UCP.ucp_rkey_pack(context_handle, memh, ctypes.byref(packed), ctypes.byref(size)), "ucp_rkey_pack")
    rkey = ctypes.string_at(packed, size.value)
    _UCP.ucp_rkey_buffer_release(packed)
    return rkey


def unmap_memory(context_handle: int, memh: int) -> None:
    _check(_UCP.ucp_mem_unmap(context_handle, memh), "ucp_mem_unmap")


def unpack_rkey(endpoint_handle: int, packed: bytes) -> int:
    rkey = ctypes.c_void_p()
    _check(_UCP.ucp_ep_rkey_unpack(endpoint_handle, packed, ctypes.byref(rkey)), "ucp_ep_rkey_unpack")
    return int(rkey.value)  # type: ignore[arg-type]


# Unpacked remote key -> (its local address) - (remote address) where this process has the peer's
# memory attached (shared memory UCX allocated on this host), or None. Constant for the key's life.
_ATTACHED: dict[int, int | None] = {}


def _attached_offset(rkey: int, remote_address: int) -> int | None:
    if rkey not in _ATTACHED:
        local = ctypes.c_void_p()
        status = _UCP.ucp_rkey_ptr(rkey, remote_address, ctypes.byref(local))
        _ATTACHED[rkey] = (int(local.value or 0) - remote_address) if status == UCS_OK else None
    return _ATTACHED[rkey]


def destroy_rkey(rkey: int) -> None:
    _ATTACHED.pop(rkey, None)
    _UCP.ucp_rkey_destroy(rkey)


def put_many(
    endpoint_handle: int, addresses: Column, lengths: Column, remote_addresses: Column, rkeys: Column
) -> PutBatch:
    """Start one-sided writes of addresses[i] (lengths[i] bytes) to remote_addresses[i] under rkeys[i];
    they have landed once a flush() issued after them completed. One call into the C loop of
    _ucp_batch.c issues them all: a ctypes call per put cost about 1 us (4096 puts per 64 MiB batch of
    16 KiB blocks)."""
    columns = [np.ascontiguousarray(values, dtype=np.uint64) for values in (addresses, lengths, remote_addresses, rkeys)]
    total = len(columns[0])
    columns, rest = _copy_attached(columns)
    count = len(columns[0])
    failed = np.empty(count, dtype=np.int64)
    first_status = ctypes.c_int32()
    failures = _BATCH.kvf_put_many(
        _PUT_NBX, _REQUEST_FREE, endpoint_handle, ctypes.addressof(_CONTIG_PARAM), count,
        *(column.ctypes.data for column in columns), failed.ctypes.data, ctypes.byref(first_status),
    )  # fmt: skip
    return PutBatch(total, rest[failed[:failures]].tolist(), first_status.value, total - count)


def _copy_attached(columns: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """Copy the puts whose target memory this process has attached (ucp_rkey_ptr: the peer allocated
    it as shared memory on this host) and return the columns of the rest, for UCP, with their indices
    in the batch. UCP 1.21 itself moves puts into such memory by CMA above 4 KiB, at about half of
    memcpy's speed for 1 MiB blocks."""
    rkeys, first = np.unique(columns[3], return_index=True)
    offsets = {int(key): _attached_offset(int(key), int(columns[2][i])) for key, i in zip(rkeys, first, strict=True)}
    attached = [key for key, offset in offsets.items() if offset is not None]
    if not attached:
        return columns, np.arange(len(columns[0]))
    direct = np.isin(columns[3], np.array(attached, dtype=np.uint64))
    shift = np.array([offsets[key] or 0 for key in rkeys.tolist()], dtype=np.int64)[np.searchsorted(rkeys, columns[3])]
    src, lengths = columns[0][direct], columns[1][direct]
    dst = (columns[2][direct].astype(np.int64) + shift[direct]).astype(np.uint64)
    copy_ranges(src, lengths, dst)
    return [column[~direct] for column in columns], np.flatnonzero(~direct)


def copy_ranges(src: np.ndarray, lengths: np.ndarray, dst: np.ndarray) -> None:
    """memcpy every range; a large batch as two halves of its bytes on two threads (a range may be cut
    in two: a coalesced run of KV blocks can be the whole batch)."""
    total = int(lengths.sum())
    if total < PARALLEL_COPY_BYTES:
        _BATCH.kvf_copy_many(len(src), src.ctypes.data, lengths.ctypes.data, dst.ctypes.data)
        return
    ends = np.cumsum(lengths)
    cut_at = int(np.searchsorted(ends, total // 2))  # the range holding the middle byte
    cut = np.uint64(total // 2 - int(ends[cut_at] - lengths[cut_at]))
    spans = [
        (np.append(src[:cut_at], src[cut_at]), np.append(lengths[:cut_at], cut), np.append(dst[:cut_at], dst[cut_at])),
        (np.append(src[cut_at] + cut, src[cut_at + 1 :]), np.append(lengths[cut_at] - cut, lengths[cut_at + 1 :]),
         np.append(dst[cut_at] + cut, dst[cut_at + 1 :])),
    ]  # fmt: skip
    arguments = [value for span in spans for value in (len(span[0]), *(column.ctypes.data for column in span))]
    _BATCH.kvf_copy_two(*arguments)


@dataclass(frozen=True)
class PutBatch:
    """The puts of one attempt: how many, the indices of those UCP answered with an error at once
    (so that a retry sends those alone), the status of the first of them, and how many were plain
    copies into memory attached here (never failed: they are done when put_many returns)."""

    size: int
    failed: list[int]
    status: int = UCS_OK
    copied: int = 0


def wake(worker_handle: int) -> None:
    """Wake the worker's thread from its epoll sleep (ucp_worker_signal: callable from any thread)."""
    _UCP.ucp_worker_signal(worker_handle)


def status_string(status: int) -> str:
    return _UCP.ucs_status_string(status).decode()


def flush(endpoint_handle: int, worker_handle: int) -> UcpRequest:
    """Completes once every put issued on the endpoint has completed at the target."""
    return UcpRequest(_UCP.ucp_ep_flush_nbx(endpoint_handle, ctypes.byref(_CONTIG_PARAM)), None, worker_handle)


class UcpRequest:
    """A UCP request with the face of a ucxx request (`completed`, `check_error()`)."""

    def __init__(self, pointer: int | None, iov: ctypes.Array | None, worker_handle: int) -> None:
        self._iov = iov  # UCX reads the list until completion
        self._worker = worker_handle
        self._pointer = pointer
        self.status = UCS_OK
        if pointer is not None and pointer >= (1 << 64) + UCS_ERR_LAST:  # UCS_PTR_IS_ERR
            self.status = pointer - (1 << 64)
            self._pointer = None

    @property
    def completed(self) -> bool:
        if self._pointer is None:
            return True
        status = _UCP.ucp_request_check_status(self._pointer)
        if status == UCS_INPROGRESS:
            return False
        self.status = status
        _UCP.ucp_request_free(self._pointer)
        self._pointer = None
        return True

    def cancel(self) -> None:
        if self._pointer is not None:
            _UCP.ucp_request_cancel(self._worker, self._pointer)

    def check_error(self) -> None:
        if self.status != UCS_OK:
            raise UcpError(_UCP.ucs_status_string(self.status).decode())


def chunks(ranges: Sequence[tuple[int, int]], step: int) -> list[Sequence[tuple[int, int]]]:
    return [ranges[start : start + step] for start in range(0, len(ranges), step)]


def _iov(ranges: Sequence[tuple[int, int]]) -> ctypes.Array:
    iov = (_Iov * len(ranges))()
    for entry, (address, length) in zip(iov, ranges, strict=True):
        entry.buffer, entry.length = address, length
    return iov


def send(endpoint_handle: int, worker_handle: int, ranges: Sequence[tuple[int, int]], tag: int) -> UcpRequest:
    """One tagged message from `ranges`: gathered when there are several, zero-copy capable when one."""
    if len(ranges) == 1:
        address, length = ranges[0]
        pointer = _UCP.ucp_tag_send_nbx(endpoint_handle, address, length, tag, ctypes.byref(_CONTIG_PARAM))
        return UcpRequest(pointer, None, worker_handle)
    iov = _iov(ranges)
    pointer = _UCP.ucp_tag_send_nbx(endpoint_handle, iov, len(ranges), tag, ctypes.byref(_IOV_PARAM))
    return UcpRequest(pointer, iov, worker_handle)


def recv(worker_handle: int, ranges: Sequence[tuple[int, int]], tag: int, cuda: bool = False) -> UcpRequest:
    """One tagged message into `ranges` (scattered when there are several; one range of device memory when
    `cuda`, which UCP is told rather than left to detect)."""
    if len(ranges) == 1:
        address, length = ranges[0]
        param = _CUDA_PARAM if cuda else _CONTIG_PARAM
        pointer = _UCP.ucp_tag_recv_nbx(worker_handle, address, length, tag, FULL_MASK, ctypes.byref(param))
        return UcpRequest(pointer, None, worker_handle)
    iov = _iov(ranges)
    pointer = _UCP.ucp_tag_recv_nbx(worker_handle, iov, len(ranges), tag, FULL_MASK, ctypes.byref(_IOV_PARAM))
    return UcpRequest(pointer, iov, worker_handle)
