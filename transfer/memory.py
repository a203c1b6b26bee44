"""Registered memory regions, and buffers made from raw (address, length) pairs for UCX."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass


@dataclass(frozen=True)
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
