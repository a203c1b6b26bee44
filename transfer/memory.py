"""Registered memory regions, and buffers made from raw (address, length) pairs for UCX."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)  # identity: hashing the fields (the rkey bytes) per range was slow
class Region:
    address: int
    length: int
    cuda: bool
    memh: int | None = None  # UCP memory handle, for host memory peers write with RMA
    rkey: bytes = b""  # the packed remote key peers need for that

    def holds(self, address: int, length: int) -> bool:
        return self.address <= address and address + length <= self.address + self.length


class _CudaBuffer:
    """Describes device memory to ucxx the way CuPy or torch would, without either."""

    def __init__(self, address: int, length: int) -> None:
        self.__cuda_array_interface__ = {
            "data": (address, False),
            "shape": (length,),
            "typestr": "|u1",
            "strides": None,
            "version": 3,
        }


_FEW_RANGES = 8  # up to this many, locate() looks ranges up one by one


class MemoryRegistry:
    def __init__(self) -> None:
        self.regions: dict[int, Region] = {}

    def register(self, address: int, length: int, cuda: bool = False, memh: int | None = None, rkey: bytes = b"") -> None:
        if address <= 0 or length <= 0:
            raise ValueError(f"cannot register address {address:#x} with length {length}")
        self.regions[address] = Region(address, length, cuda, memh, rkey)

    def unregister(self, address: int) -> Region:
        region = self.regions.pop(address, None)
        if region is None:
            raise KeyError(f"no region registered at {address:#x}")
        return region

    def find(self, address: int, length: int) -> Region | None:
        for region in self.regions.values():
            if region.holds(address, length):
                return region
        return None

    def locate(self, addresses: Sequence[int], lengths: Sequence[int]) -> tuple[set[Region], int | None]:
        """find() for a whole batch: the regions that hold its ranges, and the index of the first range
        that none holds (None when all are held). One vectorised search: a batch has up to 4096 ranges,
        and a Python loop per range cost milliseconds on each side of every write. A batch of a few ranges
        (a prompt's KV is one to a few runs of blocks) is looked up range by range: the vectorised search
        cost about 28 us there, on each side of every write, and the loop costs a few."""
        if len(addresses) <= _FEW_RANGES:
            held: set[Region] = set()
            for i, (address, length) in enumerate(zip(addresses, lengths, strict=True)):
                region = self.find(int(address), int(length))
                if region is None:
                    return held, i
                held.add(region)
            return held, None
        regions = sorted(self.regions.values(), key=lambda region: region.address)
        if not regions:
            return set(), 0 if len(addresses) else None
        starts = np.array([region.address for region in regions], dtype=np.int64)
        ends = starts + np.array([region.length for region in regions], dtype=np.int64)
        try:
            first, count = np.asarray(addresses, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
        except OverflowError:  # beyond any address: only a malformed control message carries these
            found = [self.find(address, length) for address, length in zip(addresses, lengths, strict=True)]
            return {r for r in found if r is not None}, found.index(None) if None in found else None
        index = np.searchsorted(starts, first, side="right") - 1
        inside = (index >= 0) & (count <= ends[np.maximum(index, 0)] - first)  # not first + count, which could wrap
        held = {regions[i] for i in np.unique(index[inside]).tolist()}
        for i in np.flatnonzero(~inside).tolist():  # overlapping registrations: the nearest start may not hold it
            region = self.find(addresses[i], lengths[i])
            if region is None:
                return held, i
            held.add(region)
        return held, None

    def buffer_region(self, address: int, length: int) -> Region:
        region = self.find(address, length)
        if region is None:
            raise ValueError(f"range {address:#x}+{length} is not inside registered memory")
        return region

    def buffer(self, address: int, length: int) -> object:
        """A buffer object over registered memory; raises if the range is not registered."""
        region = self.buffer_region(address, length)
        if region.cuda:
            return _CudaBuffer(address, length)
        return (ctypes.c_ubyte * length).from_address(address)
