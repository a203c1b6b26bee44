"""A caller's batch on its way to the put loop: checked once into int64 columns, and entries that continue
each other on both sides merged (exact results; the transfers themselves are the integration tests')."""

from __future__ import annotations

import numpy as np
import pytest

from kvferry.transfer.batch import MAX_RANGES_PER_BATCH, batch_columns, merge_adjacent


def test_runs_contiguous_on_both_sides_merge_and_nothing_else_does() -> None:
    # 0-2 continue each other on both sides; 3 continues 2 at the source only; 4 at the destination only.
    src = [1000, 1100, 1200, 1300, 5000]
    dst = [9000, 9100, 9200, 7000, 7050]
    lengths = [100, 100, 100, 50, 10]
    merged = merge_adjacent(*batch_columns(src, dst, lengths))
    assert [column.tolist() for column in merged] == [[1000, 1300, 5000], [9000, 7000, 7050], [300, 50, 10]]
    assert all(column.dtype == np.int64 for column in merged)


@pytest.mark.parametrize(
    ("src", "dst", "lengths", "message"),
    [
        ([1, 2], [3], [4, 5], "differ in size"),
        ([], [], [], "at least one range"),
        ([1, 2], [3, 4], [8, 0], "must be positive"),
        ([1], [2], [-8], "must be positive"),
        ([1 << 70], [2], [8], "out of range"),
        ([1] * (MAX_RANGES_PER_BATCH + 1), [2] * (MAX_RANGES_PER_BATCH + 1), [8] * (MAX_RANGES_PER_BATCH + 1), "at most"),
    ],
)
def test_malformed_batches_are_refused_before_anything_moves(src: list[int], dst: list[int], lengths: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        batch_columns(src, dst, lengths)
