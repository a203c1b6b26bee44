"""Data as tagged messages (reads, and writes that involve device memory; host-to-host writes are puts):
how a batch of ranges travels, computed alike on both sides, and the sends and receives for it."""

from __future__ import annotations

import ctypes
import random
from typing import Any

from kvferry.transfer import ucp_direct
from kvferry.transfer.config import TransferConfig
from kvferry.transfer.memory import MemoryRegistry
from kvferry.transfer.operation import Operation
from kvferry.transfer.ucx import UcxWorker

# A tag is an operation's random base with the message's index in the low bits; groups of small ranges
# set the index's top bit. The control tag (the top bit of the whole tag) is never drawn.
_INDEX_BITS = 20
_GROUP_TAG_BIT = 1 << (_INDEX_BITS - 1)


def new_tag_base() -> int:
    return random.getrandbits(40) << _INDEX_BITS


def plan_messages(
    ranges: list[tuple[int, int]], iov: bool, min_zero_copy_bytes: int, max_ranges_per_message: int
) -> list[tuple[int, list[tuple[int, int]]]]:
    """How a batch travels: (tag offset, ranges) per message, computed alike on both sides from the
    same lengths. A range of at least min_zero_copy_bytes goes alone, since UCX moves a contiguous
    message by zero-copy rendezvous; smaller ones share scatter-gather messages (UCX copies those through
    shared memory, but one message instead of many is what counts at that size)."""
    messages: list[tuple[int, list[tuple[int, int]]]] = []
    small: list[tuple[int, int]] = []
    for index, (address, length) in enumerate(ranges):
        if iov and length < min_zero_copy_bytes:
            small.append((address, length))
        else:
            messages.append((index, [(address, length)]))
    for group, chunk in enumerate(ucp_direct.chunks(small, max_ranges_per_message)):
        messages.append((_GROUP_TAG_BIT | group, list(chunk)))
    return messages


class DataMessages:
    def __init__(self, worker: UcxWorker, memory: MemoryRegistry, config: TransferConfig) -> None:
        self._worker = worker
        self._memory = memory
        self._config = config

    def send(self, op: Operation, endpoint: Any, ranges: list[tuple[int, int]], tag_base: int, host: bool) -> None:
        """Host memory goes through the direct UCP binding (cheaper per message than ucxx's objects);
        device memory through ucxx, which describes it to UCX as CUDA memory (CUDA IPC)."""
        for offset, group in self._plan(ranges, host):
            if host:
                op.requests.append(ucp_direct.send(endpoint.handle, self._worker.handle, group, tag_base | offset))
                continue
            buffer = self._memory.buffer(*group[0])
            op.keep.append(buffer)
            op.requests.append(UcxWorker.send(endpoint, buffer, tag_base | offset))

    def receive(self, op: Operation, endpoint: Any, ranges: list[tuple[int, int]], tag_base: int, host: bool) -> None:
        for offset, group in self._plan(ranges, host):
            if host:
                op.requests.append(ucp_direct.recv(self._worker.handle, group, tag_base | offset))
                continue
            buffer = self._memory.buffer(*group[0])
            op.keep.append(buffer)
            op.requests.append(UcxWorker.recv(endpoint, buffer, tag_base | offset))

    def receive_cancellable(self, op: Operation, ranges: list[tuple[int, int]], tag_base: int) -> None:
        """Receives for the device-memory plan (a message per range) that can be cancelled one by one: a
        prepared write's, which its writer may withdraw. ucxx's go only with their endpoint, and closing the
        endpoint the writer's is paired with broke that writer's next rendezvous (its data never arrived)."""
        for offset, group in self._plan(ranges, False):
            cuda = self._memory.buffer_region(*group[0]).cuda
            op.requests.append(ucp_direct.recv(self._worker.handle, group, tag_base | offset, cuda=cuda))

    def drain(self, op: Operation, ranges: list[tuple[int, int]], tag_base: int) -> None:
        """A receive for each message of a refused write (device memory's plan), into one byte of host
        scratch: each ends truncated, and UCX then answers the writer's send without fetching its data."""
        scratch = bytearray(1)
        op.keep.append(scratch)
        address = ctypes.addressof(ctypes.c_char.from_buffer(scratch))
        for offset, _group in self._plan(ranges, False):
            op.requests.append(ucp_direct.recv(self._worker.handle, [(address, 1)], tag_base | offset))

    def _plan(self, ranges: list[tuple[int, int]], iov: bool) -> list[tuple[int, list[tuple[int, int]]]]:
        return plan_messages(ranges, iov, self._config.min_zero_copy_bytes, self._config.max_ranges_per_message)
