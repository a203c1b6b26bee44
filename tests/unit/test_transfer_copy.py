"""Puts into a peer's shared memory attached here are copies (ucp_direct.copy_ranges): a batch of at least
PARALLEL_COPY_BYTES is split at its middle byte over two threads, cutting the range that holds it; in a
batch that also holds real puts, a put that fails is reported by its index in the whole batch (the put
function there is a fake that fails, named so: that test is about faults)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kvferry.transfer import ucp_direct
from kvferry.transfer.ucp_direct import PARALLEL_COPY_BYTES, copy_ranges
from tests.unit.test_transfer_native import PUT, UCS_ERR_CONNECTION_RESET

TOTAL = 2 * PARALLEL_COPY_BYTES


@pytest.mark.parametrize(
    "lengths",
    [
        [TOTAL],  # one coalesced run: cut in two
        [TOTAL // 2 - 1, 2, TOTAL // 2 - 1],  # the middle byte inside a short range
        [TOTAL // 2, TOTAL // 2],  # the middle falls on a boundary
        [100, TOTAL - 100],
        [PARALLEL_COPY_BYTES // 4 - 3],  # below the threshold: one thread
    ],
)
def test_every_byte_lands_once_in_its_place(lengths: list[int]) -> None:
    source = np.random.default_rng(len(lengths)).integers(0, 256, sum(lengths), dtype=np.uint8)
    target = np.zeros(sum(lengths) + 64, dtype=np.uint8)  # scattered: ranges land in reverse order, 16 bytes apart
    counts = np.array(lengths, dtype=np.uint64)
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.uint64)
    places = np.array([int(target.nbytes - 16 * i - sum(lengths[: i + 1])) for i in range(len(lengths))], dtype=np.uint64)
    copy_ranges(source.ctypes.data + offsets, counts, target.ctypes.data + places)
    expected = np.zeros_like(target)
    for offset, place, count in zip(offsets.tolist(), places.tolist(), lengths, strict=True):
        expected[place : place + count] = source[offset : offset + count]
    assert np.array_equal(target, expected)


def test_a_mixed_batch_copies_attached_ranges_and_names_failed_puts_by_batch_index(monkeypatch: pytest.MonkeyPatch) -> None:
    attached_key, other_key, remote_base, block = 101, 202, 1 << 40, 4096  # unpacked key handles, as UCP's
    kinds = "CPPCPCPP"  # C: into memory attached here, P: a UCP put
    source = np.random.default_rng(5).integers(0, 256, len(kinds) * block, dtype=np.uint8)
    attached = np.zeros(len(kinds) * block, dtype=np.uint8)  # stands for the peer's segment mapped here
    monkeypatch.setitem(ucp_direct._ATTACHED, attached_key, attached.ctypes.data - remote_base)
    monkeypatch.setitem(ucp_direct._ATTACHED, other_key, None)
    issued: list[int] = []

    def fake_put_failing_every_second(endpoint: int, buffer: int, length: int, remote: int, rkey: int, param: int) -> int | None:
        issued.append(remote)
        return UCS_ERR_CONNECTION_RESET % (1 << 64) if len(issued) % 2 == 0 else None

    put = PUT(fake_put_failing_every_second)
    monkeypatch.setattr(ucp_direct, "_PUT_NBX", ctypes.cast(put, ctypes.c_void_p).value)
    src = [source.ctypes.data + i * block for i in range(len(kinds))]
    remote = [remote_base + (len(kinds) - 1 - i) * block for i in range(len(kinds))]  # reversed
    rkeys = [attached_key if kind == "C" else other_key for kind in kinds]
    batch = ucp_direct.put_many(11, src, [block] * len(kinds), remote, rkeys)
    puts = [i for i, kind in enumerate(kinds) if kind == "P"]
    assert issued == [remote[i] for i in puts]
    assert (batch.size, batch.copied, batch.failed, batch.status) == (8, 3, puts[1::2], UCS_ERR_CONNECTION_RESET)
    expected = np.zeros_like(attached)
    for i, kind in enumerate(kinds):
        if kind == "C":
            place = remote[i] - remote_base
            expected[place : place + block] = source[i * block : (i + 1) * block]
    assert np.array_equal(attached, expected)
