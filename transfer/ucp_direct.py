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
from itertools import repeat

import libucx

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
_UCP.ucp_rkey_pack.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
_UCP.ucp_rkey_buffer_release.argtypes = [ctypes.c_void_p]
_UCP.ucp_ep_rkey_unpack.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
_UCP.ucp_rkey_destroy.argtypes = [ctypes.c_void_p]
_UCP.ucp_worker_signal.argtypes = [ctypes.c_void_p]
_UCP.ucs_status_string.restype = ctypes.c_char_p
_UCP.ucs_status_string.argtypes = [ctypes.c_int]

UCS_OK, UCS_INPROGRESS, UCS_ERR_LAST = 0, 1, -100
UCP_OP_ATTR_FIELD_DATATYPE = 1 << 3
UCP_DATATYPE_IOV = 2
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


_MEM_MAP_ADDRESS_AND_LENGTH = (1 << 0) | (1 << 1)


def _check(status: int, what: str) -> None:
    if status != UCS_OK:
        raise UcpError(f"{what}: {_UCP.ucs_status_string(status).decode()}")


def map_memory(context_handle: int, address: int, length: int) -> tuple[int, bytes]:
    """Register existing memory for RMA; returns (memory handle, packed remote key for peers)."""
    params = _MemMapParams(field_mask=_MEM_MAP_ADDRESS_AND_LENGTH, address=address, length=length)
    memh = ctypes.c_void_p()
    _check(_UCP.ucp_mem_map(context_handle, ctypes.byref(params), ctypes.byref(memh)), "ucp_mem_map")
    packed, size = ctypes.c_void_p(), ctypes.c_size_t()
    _check(_UCP.ucp_rkey_pack(context_handle, memh, ctypes.byref(packed), ctypes.byref(size)), "ucp_rkey_pack")
    rkey = ctypes.string_at(packed, size.value)
    _UCP.ucp_rkey_buffer_release(packed)
    return int(memh.value), rkey  # type: ignore[arg-type]


def unmap_memory(context_handle: int, memh: int) -> None:
    _check(_UCP.ucp_mem_unmap(context_handle, memh), "ucp_mem_unmap")


def unpack_rkey(endpoint_handle: int, packed: bytes) -> int:
    rkey = ctypes.c_void_p()
    _check(_UCP.ucp_ep_rkey_unpack(endpoint_handle, packed, ctypes.byref(rkey)), "ucp_ep_rkey_unpack")
    return int(rkey.value)  # type: ignore[arg-type]


def destroy_rkey(rkey: int) -> None:
    _UCP.ucp_rkey_destroy(rkey)


def put_many(
    endpoint_handle: int, addresses: Sequence[int], lengths: Sequence[int], remote_addresses: Sequence[int], rkeys: Sequence[int]
) -> PutBatch:
    """Start one-sided writes of addresses[i] (lengths[i] bytes) to remote_addresses[i] under rkeys[i];
    they have landed once a flush() issued after them completed. map() drives the calls from C: about
    1 us a put, where a Python loop with tuple unpacking cost twice that (1024 puts per 64 MiB batch of
    64 KiB blocks)."""
    param = ctypes.byref(_CONTIG_PARAM)
    return PutBatch(list(map(_UCP.ucp_put_nbx, repeat(endpoint_handle), addresses, lengths, remote_addresses, rkeys, repeat(param))))


def error_pointer(status: int) -> int:
    """How UCP answers an operation that failed at once instead of with a request (UCS_STATUS_PTR)."""
    return (1 << 64) + status


class PutBatch:
    """The puts of one attempt. UCP answers each put with None (done), a request (in flight: freed at
    once, UCP releases it itself when it completes) or an error pointer (that put failed); `failed`
    keeps the indices of the failed ones, so that a retry sends those alone."""

    def __init__(self, pointers: list[int | None]) -> None:
        self.size = len(pointers)
        in_flight = [pointer for pointer in pointers if pointer is not None]
        self.failed: list[int] = []
        self.status = UCS_OK
        if in_flight and max(in_flight) >= error_pointer(UCS_ERR_LAST):  # rare: find which
            self.failed = [i for i, p in enumerate(pointers) if p is not None and p >= error_pointer(UCS_ERR_LAST)]
            self.status = pointers[self.failed[0]] - (1 << 64)  # type: ignore[operator]
            in_flight = [pointer for pointer in in_flight if pointer < error_pointer(UCS_ERR_LAST)]
        list(map(_UCP.ucp_request_free, in_flight))


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


def recv(worker_handle: int, ranges: Sequence[tuple[int, int]], tag: int) -> UcpRequest:
    """One tagged message into `ranges` (scattered when there are several)."""
    if len(ranges) == 1:
        address, length = ranges[0]
        pointer = _UCP.ucp_tag_recv_nbx(worker_handle, address, length, tag, FULL_MASK, ctypes.byref(_CONTIG_PARAM))
        return UcpRequest(pointer, None, worker_handle)
    iov = _iov(ranges)
    pointer = _UCP.ucp_tag_recv_nbx(worker_handle, iov, len(ranges), tag, FULL_MASK, ctypes.byref(_IOV_PARAM))
    return UcpRequest(pointer, iov, worker_handle)
