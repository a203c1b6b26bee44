"""A caller's batch of (source, destination, length) ranges: checked, as int64 columns, and merged where
ranges continue each other on both sides."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvferry.transfer import protocol

MAX_RANGES_PER_BATCH = protocol.MAX_RANGES


def merge_adjacent(first: np.ndarray, second: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge consecutive entries that continue each other on both sides: one message instead of many
    (the per-message cost dominates below a few hundred KiB). Vectorised: batches hold thousands."""
    continues = (first[1:] == first[:-1] + lengths[:-1]) & (second[1:] == second[:-1] + lengths[:-1])
    starts = np.flatnonzero(np.concatenate(([True], ~continues)))
    return first[starts], second[starts], np.add.reduceat(lengths, starts)


def batch_columns(first: Sequence[int], second: Sequence[int], lengths: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A caller's batch, checked, as int64 columns: each list is converted once, and a host write stays
    in numpy from here to the C put loop (converting back and forth cost about a millisecond per 1024
    ranges)."""
    if not (len(first) == len(second) == len(lengths)):
        raise ValueError(f"address and length lists differ in size: {len(first)}, {len(second)}, {len(lengths)}")
    if len(lengths) > MAX_RANGES_PER_BATCH:
        raise ValueError(f"a batch holds at most {MAX_RANGES_PER_BATCH} ranges, got {len(lengths)}")
    try:
        columns = tuple(np.asarray(values, dtype=np.int64) for values in (first, second, lengths))
    except OverflowError as exc:
        raise ValueError(f"an address or length of the batch is out of range: {exc}") from exc
    if not len(lengths) or bool((columns[2] <= 0).any()):
        raise ValueError("a batch needs at least one range, and every length must be positive")
    return columns  # type: ignore[return-value]
