"""Scatter-gather tagged messages: the one UCP call ucxx does not expose, bound with ctypes.

A batch of n (address, length) ranges would cost n tagged messages through ucxx, and the per-message
cost (tens of microseconds in the Python path) dominates below a few hundred KiB. UCP's IOV datatype
sends the whole list as ONE message: the sender gathers from its ranges, the receiver scatters into its
own, and the split points need not match. The call goes to the same libucp that ucxx loaded, on the
same worker and endpoint handles, from the transfer loop's thread, so UCX sees one single-threaded user.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence

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


class IovRequest:
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


def send(endpoint_handle: int, worker_handle: int, ranges: Sequence[tuple[int, int]], tag: int) -> IovRequest:
    """One tagged message from `ranges`: gathered when there are several, zero-copy capable when one."""
    if len(ranges) == 1:
        address, length = ranges[0]
        pointer = _UCP.ucp_tag_send_nbx(endpoint_handle, address, length, tag, ctypes.byref(_CONTIG_PARAM))
        return IovRequest(pointer, None, worker_handle)
    iov = _iov(ranges)
    pointer = _UCP.ucp_tag_send_nbx(endpoint_handle, iov, len(ranges), tag, ctypes.byref(_IOV_PARAM))
    return IovRequest(pointer, iov, worker_handle)


def recv(worker_handle: int, ranges: Sequence[tuple[int, int]], tag: int) -> IovRequest:
    """One tagged message into `ranges` (scattered when there are several)."""
    if len(ranges) == 1:
        address, length = ranges[0]
        pointer = _UCP.ucp_tag_recv_nbx(worker_handle, address, length, tag, FULL_MASK, ctypes.byref(_CONTIG_PARAM))
        return IovRequest(pointer, None, worker_handle)
    iov = _iov(ranges)
    pointer = _UCP.ucp_tag_recv_nbx(worker_handle, iov, len(ranges), tag, FULL_MASK, ctypes.byref(_IOV_PARAM))
    return IovRequest(pointer, iov, worker_handle)
