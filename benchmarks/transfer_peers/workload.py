"""The data every system in the transfer benchmark moves: one source buffer, one destination buffer, and
descriptor lists that send block i of the source to slot `slots[i]` of the destination.

Every process (the benchmark itself and each peer) rebuilds the same bytes and the same slots from the
same seeds, so only seeds and addresses cross process boundaries, never data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xxhash

DATA_SEED = 20240611
SLOT_SEED = 7  # the permutation of destination slots, per block size (the same for every system)
KiB = 1 << 10
MiB = 1 << 20
BLOCK_SIZES = (16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB)


def source_bytes(nbytes: int, seed: int = DATA_SEED) -> np.ndarray:
    """Random bytes (not zeros or a pattern) so a checksum cannot pass by accident."""
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


def scattered_slots(count: int, seed: int) -> np.ndarray:
    """A random permutation of 0..count-1 in which no two consecutive source blocks land in consecutive
    slots: every engine here merges descriptors that continue each other, and a lucky adjacency would
    turn two messages into one."""
    rng = np.random.default_rng(seed)
    slots = rng.permutation(count)
    if count < 3:
        return slots
    while True:
        bad = np.flatnonzero(slots[1:] == slots[:-1] + 1) + 1
        if bad.size == 0:
            return slots
        for index in bad:  # swapping with a random position breaks the pair; repeat until none is left
            other = int(rng.integers(count))
            slots[index], slots[other] = slots[other], slots[index]


@dataclass(frozen=True)
class Batch:
    """One batch: `count` blocks of `block_bytes`; `seed` None means block i goes to slot i (contiguous)."""

    block_bytes: int
    count: int
    seed: int | None

    @property
    def nbytes(self) -> int:
        return self.block_bytes * self.count

    def slots(self) -> np.ndarray:
        if self.seed is None:
            return np.arange(self.count)
        return scattered_slots(self.count, self.seed)

    def descriptors(self, src_base: int, dst_base: int) -> tuple[list[int], list[int], list[int]]:
        """(src_addrs, dst_addrs, lengths), one entry per block, in source order."""
        offsets = np.arange(self.count, dtype=np.int64) * self.block_bytes
        dst_offsets = self.slots().astype(np.int64) * self.block_bytes
        return (
            (src_base + offsets).tolist(),
            (dst_base + dst_offsets).tolist(),
            [self.block_bytes] * self.count,
        )

    def to_json(self) -> dict[str, object]:
        return {"block_bytes": self.block_bytes, "count": self.count, "seed": self.seed}

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> Batch:
        return cls(
            int(raw["block_bytes"]), int(raw["count"]), None if raw["seed"] is None else int(raw["seed"])
        )  # type: ignore[arg-type]


def batch_for(block_bytes: int, batch_bytes: int, contiguous: bool = False) -> Batch:
    """`batch_bytes` of `block_bytes` blocks, scattered over the destination's slots unless `contiguous`."""
    return Batch(block_bytes, batch_bytes // block_bytes, None if contiguous else SLOT_SEED)


def size_label(nbytes: int) -> str:
    """A block or batch size as the tables print it: whole MiB from 1 MiB up, else whole KiB."""
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"


def expected_image(source: np.ndarray, batch: Batch) -> np.ndarray:
    """What the destination's first `batch.nbytes` bytes must hold after the batch."""
    image = np.empty(batch.nbytes, dtype=np.uint8)
    image.reshape(batch.count, batch.block_bytes)[batch.slots()] = source[: batch.nbytes].reshape(
        batch.count, batch.block_bytes
    )
    return image


def digest(buffer: np.ndarray, nbytes: int) -> str:
    return xxhash.xxh3_64_hexdigest(memoryview(buffer[:nbytes]))


def address(buffer: np.ndarray) -> int:
    return int(buffer.ctypes.data)
