"""Float32 linear layers on the CPU for a few rows (decode batches) through oneDNN, weights prepacked.

torch's `F.linear` runs MKL's GEMV for one row and MKL's GEMM from two rows on; for 2-64 rows that GEMM
reads the weights at about half the GEMV's speed, so a decode step of two sequences cost 1.9x a step of
one. oneDNN's kernel, on a copy of the weight reordered once into its blocked layout, reads the weights
at GEMV speed or better for any small row count. The packed copy is made on a weight's first small call
and lives as long as the weight: a decode node holds its matmul weights twice, a prefill node (whose
calls are large) once. From a few hundred rows on MKL's GEMM is as fast, and prefill stays there.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

# Up to this many rows the packed kernel was faster on one core; at 2048 rows MKL's GEMM was.
PACKED_MAX_ROWS = 256

_packed_weights: WeakIdKeyDictionary = WeakIdKeyDictionary()


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether this call takes the packed path: float32 on the CPU, 2-D input of a few rows."""
    return (
        x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.device.type == "cpu"
        and x.dim() == 2
        and 1 <= x.shape[0] <= PACKED_MAX_ROWS
        and torch.backends.mkldnn.is_available()
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) with the weight's packed copy, packing it on first use."""
    packed = _packed_weights.get(weight)
    if packed is None:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        _packed_weights[weight] = packed
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
