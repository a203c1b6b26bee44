"""This engine's memory as UCX knows it: regions registered (and mapped for peers' puts) or allocated by UCX.

Every call here makes UCX calls: the engine runs them on its loop thread.
"""

from __future__ import annotations

from kvferry.transfer import ucp_direct
from kvferry.transfer.memory import MemoryRegistry
from kvferry.transfer.ucx import UcxWorker


class LocalMemory:
    def __init__(self, worker: UcxWorker, regions: MemoryRegistry) -> None:
        self._worker = worker
        self._regions = regions

    def register(self, address: int, length: int, cuda_device: int | None) -> None:
        """Host memory is mapped for RMA, so that peers can put into it; device memory moves by tagged
        messages through CUDA IPC, and its GPU first becomes current on this (the loop) thread: UCX's CUDA
        transports work in the CUDA context current on the calling thread, and a fresh thread's is GPU 0's,
        wherever the memory lives."""
        if cuda_device is not None:
            import torch

            torch.cuda.set_device(cuda_device)
        mapped = () if cuda_device is not None else ucp_direct.map_memory(self._worker.context_handle, address, length)
        self._regions.register(address, length, cuda_device is not None, *mapped)

    def allocate(self, length: int) -> int:
        """Host memory UCX allocates and registers: the address of at least `length` bytes."""
        memh, address, size, rkey = ucp_direct.allocate_memory(self._worker.context_handle, length)
        self._regions.register(address, size, False, memh, rkey)
        return address

    def unregister(self, address: int) -> None:
        region = self._regions.unregister(address)
        if region.memh is not None:
            ucp_direct.unmap_memory(self._worker.context_handle, region.memh)
