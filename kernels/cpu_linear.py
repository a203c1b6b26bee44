"""Float32 linear layers on the CPU for a few rows (decode batches) through oneDNN, weights prepacked.

torch's `F.linear` runs MKL's GEMV for one row and MKL's GEMM from two rows on; for 2-64 rows that GEMM
reads the weights at about half the GEMV's speed, so a decode step of two sequences cost 1.9x a step of
one. oneDNN's kernel, on a copy of the weight reordered once into its blocked layout, reads the weights
at GEMV speed or better for any small row count. The packed copy is made on a weight's first small call
and lives as long as the weight: a decode node holds its matmul weights twice, a prefill node (whose
calls are large) once. From a few hundred rows on MKL's GEMM is as fast, and prefill stays there.

bfloat16 takes the same path where oneDNN has bfloat16 kernels for this CPU (AVX-512 BF16 or AMX): half
the bytes of float32 to read a token, and, for sixteen rows or the LM head, half the time of `F.linear`
on the same bfloat16 weights (docs/benchmarks.md, "The real model on the CPU").
"""

from __future__ import annotations

import weakref

import torch

# Up to this many rows the packed kernel was faster on one core; at 2048 rows MKL's GEMM was.
PACKED_MAX_ROWS = 256

# id(weight) -> its packed copy, dropped by a finalizer when the weight goes (before its id can be reused). A
# plain dict: torch's WeakIdKeyDictionary made a weak reference for every lookup, a few microseconds a call.
_packed_weights: dict[int, torch.Tensor] = {}


def _packed_dtypes() -> frozenset[torch.dtype]:
    if not torch.backends.mkldnn.is_available():
        return frozenset()
    bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return frozenset({torch.float32, torch.bfloat16} if bf16 else {torch.float32})


# Asked once: the answer is the CPU's and torch's, and a decode step asks a few hundred times.
PACKED_DTYPES = _packed_dtypes()


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether this call takes the packed path: a packed dtype on the CPU, 2-D input of a few rows."""
    return (
        x.dtype in PACKED_DTYPES
        and weight.dtype == x.dtype
        and x.device.type == "cpu"
        and x.dim() == 2
        and 1 <= x.shape[0] <= PACKED_MAX_ROWS
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) with the weight's packed copy, packing it on first use."""
    packed = _packed_weights.get(id(weight))
    if packed is None:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        _packed_weights[id(weight)] = packed
        weakref.finalize(weight, _packed_weights.pop, id(weight), None)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
