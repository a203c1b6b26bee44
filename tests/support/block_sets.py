"""Block id sets for the transfer tests."""

from __future__ import annotations

import random

NUM_BLOCKS = 256


def fragmented(rng: random.Random, count: int) -> list[int]:
    """Block ids with gaps and short runs, the way a long-running pool hands them out."""
    ids: list[int] = []
    candidate = 1
    while len(ids) < count:
        run = rng.randint(1, 5)
        ids.extend(range(candidate, min(candidate + run, NUM_BLOCKS)))
        candidate += run + rng.randint(1, 4)
    if rng.random() < 0.5:  # half the sets out of order too
        rng.shuffle(ids)
    return ids[:count]
