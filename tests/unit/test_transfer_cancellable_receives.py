"""A prepared write's receives (DataMessages.receive_cancellable): posted through the direct UCP binding,
each cancelled on its own when the write is withdrawn, and ended by UCX on the next progress, on a real
UCX worker. (Device memory takes the same path with its memory type named; tests/gpu covers it.)"""

from __future__ import annotations

import ctypes

import pytest

from kvferry.transfer.config import TransferConfig
from kvferry.transfer.data_messages import DataMessages, new_tag_base
from kvferry.transfer.memory import MemoryRegistry
from kvferry.transfer.operation import Operation, cancel
from kvferry.transfer.ucp_direct import UcpError
from kvferry.transfer.ucx import UcxWorker


def test_cancelled_receives_end_without_data_and_release_their_requests():
    worker = UcxWorker()
    memory = MemoryRegistry()
    buffer = (ctypes.c_ubyte * (3 << 20))()
    base = ctypes.addressof(buffer)
    memory.register(base, len(buffer))
    op = Operation("writer", "inbound_write", deadline=float("inf"))
    ranges = [(base, 1 << 20), (base + (2 << 20), 1 << 20)]
    DataMessages(worker, memory, TransferConfig()).receive_cancellable(op, ranges, new_tag_base())
    assert len(op.requests) == 2  # one per range: the device plan, whatever the size
    for _ in range(20):
        worker.progress()
    assert not any(request.completed for request in op.requests)  # posted, waiting for data
    cancel(op)
    for _ in range(20):
        worker.progress()
    assert all(request.completed for request in op.requests)
    for request in op.requests:  # ended as cancelled, with no data
        with pytest.raises(UcpError, match="(?i)cancel"):
            request.check_error()
    assert bytes(buffer) == bytes(len(buffer))
