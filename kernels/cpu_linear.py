"""Linear layers on the CPU for a few rows (decode batches), weights prepacked: kvferry's C kernel
(kernels/cpu_gemv.py), or oneDNN's where the C kernels are off (`KVFERRY_KERNELS=torch`).

torch's `F.linear` runs MKL's GEMV for one row and MKL's GEMM from two rows on; for 2-64 rows that GEMM
reads the weights at about half the GEMV's speed. oneDNN's kernel, on a copy of the weight reordered once
into its blocked layout, reads them at GEMV speed for any small row count, but that is itself about half
this machine's memory bandwidth at one row, and a call costs about 15 us before any work (a decode step
makes 121). The C kernel reads them at close to the bandwidth on both cores, for 4 us a call, and at 2-256
rows it was as fast as oneDNN or faster (docs/benchmarks.md, "The real model on the CPU").

The packed copy is made on a weight's first small call and lives as long as the weight: a decode node holds
its matmul weights twice, a prefill node (whose calls are large) once. From a few hundred rows on MKL's GEMM
is as fast, and prefill stays there.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TypeVar

import torch

from kvferry.kernels import cpu_gemv

# Up to this many rows the packed kernels were faster on one core; at 2048 rows MKL's GEMM was.
PACKED_MAX_ROWS = 256

# id(weight) -> its packed copy (the C kernel's; oneDNN's), dropped by a finalizer when the weight goes
# (before its id can be reused). Plain dicts: torch's WeakIdKeyDictionary made a weak reference for every
# lookup, a few microseconds a call.
_packed_weights: dict[int, cpu_gemv.PackedWeight] = {}
_onednn_weights: dict[int, torch.Tensor] = {}


def _onednn_dtypes() -> frozenset[torch.dtype]:
    if not torch.backends.mkldnn.is_available():
        return frozenset()
    bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return frozenset({torch.float32, torch.bfloat16} if bf16 else {torch.float32})


# Asked once: the answer is the CPU's and torch's, and a decode step asks a few hundred times.
ONEDNN_DTYPES = _onednn_dtypes()
PACKED_DTYPES = ONEDNN_DTYPES | frozenset(cpu_gemv.DTYPES)


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether this call takes a packed path: a packed dtype on the CPU, 2-D input of a few rows."""
    return (
        x.dtype in PACKED_DTYPES
        and weight.dtype == x.dtype
        and x.is_cpu  # not x.device.type: that makes a device object, a quarter of a microsecond a call
        and x.dim() == 2
        and 1 <= x.shape[0] <= PACKED_MAX_ROWS
    )


Packed = TypeVar("Packed", cpu_gemv.PackedWeight, torch.Tensor)


def _packed(weight: torch.Tensor, copies: dict[int, Packed], pack: Callable[[torch.Tensor], Packed]) -> Packed:
    packed = copies.get(id(weight))
    if packed is None:
        packed = copies[id(weight)] = pack(weight)
        weakref.finalize(weight, copies.pop, id(weight), None)
    return packed


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, native: bool) -> torch.Tensor:
    """x @ weight.T (+ bias) with the weight's packed copy, packing it on first use (see `applies`): the C
    kernel's where `native` (dispatch's choice), else oneDNN's."""
    if native and x.dtype in cpu_gemv.DTYPES:
        packed = _packed(weight, _packed_weights, cpu_gemv.pack)
        return cpu_gemv.linear(x.contiguous(), packed, bias, torch.get_num_threads())
    if x.dtype in ONEDNN_DTYPES:
        packed = _packed(weight, _onednn_weights, torch.ops.mkldnn._reorder_linear_weight)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return torch.nn.functional.linear(x, weight, bias)
