"""MemoryRegistry.locate: its range-by-range lookup (a few ranges) and its vectorised one (many) give what
find() gives range by range."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kvferry.transfer.memory import MemoryRegistry


def by_find(registry: MemoryRegistry, addresses: list[int], lengths: list[int]) -> tuple[set, int | None]:
    held = set()
    for i, (address, length) in enumerate(zip(addresses, lengths, strict=True)):
        region = registry.find(address, length)
        if region is None:
            return held, i
        held.add(region)
    return held, None


@pytest.mark.parametrize("batch", [1, 3, 8, 9, 40])
def test_locate_agrees_with_find_range_by_range(batch):
    rng = random.Random(batch)
    registry = MemoryRegistry()
    for start in (1 << 20, 5 << 20, (5 << 20) + 4096):  # the last two overlap
        registry.register(start, rng.choice([1 << 20, 2 << 20]))
    for _ in range(200):
        addresses = [rng.randrange(1 << 19, 8 << 20) for _ in range(batch)]
        lengths = [rng.choice([1, 4096, 1 << 16, 1 << 20]) for _ in range(batch)]
        if rng.random() < 0.5:  # mostly inside: ranges of a registered region
            addresses = [rng.randrange(1 << 20, (2 << 20) - length + 1) for length in lengths]
        held, outside = registry.locate(np.array(addresses), np.array(lengths))
        expected_held, expected_outside = by_find(registry, addresses, lengths)
        assert outside == expected_outside
        if outside is None:
            assert held == expected_held
