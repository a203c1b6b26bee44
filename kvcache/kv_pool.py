"""The node's KV pool: one tensor allocated once, laid out so blocks are the unit of transfer.

Layout [num_blocks, num_layers, 2 (K, V), block_size, num_kv_heads, head_dim]: everything a block holds,
across all layers, is one contiguous region, and consecutive block ids are consecutive regions, so a run
of blocks ships as one message (DESIGN.md §3-4). Attention reads a layer's K or V as a strided view.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

LAYOUT_NAME = "block-major:[block,layer,kv,slot,head,dim]"


@dataclass(frozen=True)
class KVPoolLayout:
    """What two pools must agree on before blocks can move between them."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str
    layout: str = LAYOUT_NAME
    # The weights that compute the KV (engine/weights_fingerprint.py); empty where none do (raw test pools).
    weights: str = ""

    def bytes_per_block(self) -> int:
        element_size = torch.empty((), dtype=getattr(torch, self.dtype)).element_size()
        return self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim * element_size

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


# Host memory from someone else: bytes -> address (the transfer engine's allocate_managed_buffer, whose
# shared memory a writer on the same host fills by plain copies; docs/transfer.md).
HostAllocator = Callable[[int], int]


class KVPool:
    def __init__(
        self, layout: KVPoolLayout, num_blocks: int, device: str | torch.device = "cpu", allocate: HostAllocator | None = None
    ) -> None:
        """`allocate`, when given, provides a pool in host memory; a device pool ignores it."""
        self.layout = layout
        self.num_blocks = num_blocks
        shape = (num_blocks, layout.num_layers, 2, layout.block_size, layout.num_kv_heads, layout.head_dim)
        dtype = getattr(torch, layout.dtype)
        nbytes = num_blocks * layout.bytes_per_block()
        if allocate is not None and torch.device(device).type == "cpu" and nbytes > 0:
            raw = (ctypes.c_ubyte * nbytes).from_address(allocate(nbytes))
            self.tensor = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).view(shape).zero_()
        else:
            self.tensor = torch.zeros(shape, dtype=dtype, device=device)
        # Made once: a decode step asks for every layer's views, and two slicings cost ~10 us a layer on a CPU.
        self._layer_views = [(self.tensor[:, layer, 0], self.tensor[:, layer, 1]) for layer in range(layout.num_layers)]

    @classmethod
    def blocks_for_budget(cls, layout: KVPoolLayout, budget_bytes: int) -> int:
        return max(0, budget_bytes // layout.bytes_per_block())

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Strided [num_blocks, block_size, num_kv_heads, head_dim] views of one layer's K and V."""
        return self._layer_views[layer]

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self.layout.block_size

    def block_bytes(self) -> int:
        return self.layout.bytes_per_block()
