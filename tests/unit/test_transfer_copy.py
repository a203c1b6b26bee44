"""Puts into a peer's shared memory attached here are copies (ucp_direct.copy_ranges): a batch of at least
PARALLEL_COPY_BYTES is split at its middle byte over two threads, cutting the range that holds it."""

from __future__ import annotations

import numpy as np
import pytest
from kvferry.transfer.ucp_direct import PARALLEL_COPY_BYTES, copy_ranges

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
