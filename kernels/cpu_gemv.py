"""The CPU's decode-batch linear layers in C (kernels/_cpu_gemv.c): x @ W.T for a few rows of bfloat16 or
float32, with W in their dtype or in int8 with a float32 scale per output row (kernels/int8_linear.py; the rows
then quantized in blocks of QUANT_BLOCK, as llama.cpp's Q8_0 does, for AVX-512 VNNI's integer dot products),
each weight byte read once at close to the memory bandwidth, on torch's own threads.

oneDNN's prepacked kernel (kernels/cpu_linear.py's other path) read SmolLM2's weights at about half this
machine's bandwidth for one row, and a batch-1 decode step is little else. The weight is packed once into
the C kernel's tiles (`pack`); cpu_linear.py keeps that copy as long as the weight lives.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from kvferry.native_library import NativeLibrary

LIBRARY = NativeLibrary(Path(__file__).with_name("_cpu_gemv.c"), "kvferry.kernels' CPU linear kernels",
                        ("-O3", "-fopenmp", "-fno-math-errno", "-lm"), ("_cpu_bf16_bits.h",))  # fmt: skip
TILE = 32  # outputs a tile, as the C file's
QUANT_BLOCK = 32  # activations a scale against int8 weights, as the C file's
_INT8_OFFSET = 128  # int8 weights are stored as unsigned bytes, value + 128 (VNNI's unsigned operand)
DTYPES = (torch.bfloat16, torch.float32)

_int64, _pointer, _int = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
_SIGNATURES = {  # name: (restype, argtypes)
    "kvf_linear_bf16": (None, [_pointer] * 4 + [_int64] * 3 + [_int] * 2),
    "kvf_linear_f32": (None, [_pointer] * 4 + [_int64] * 3 + [_int] * 2),
    "kvf_linear_int8": (_int, [_pointer] * 5 + [_int64] * 3 + [_int] * 3),
    "kvf_linear_has_vector_kernel": (_int, [_int]),
}
_library: ctypes.CDLL | None = None  # loaded on first use, after torch: it binds to torch's OpenMP (see the C file)


def _loaded() -> ctypes.CDLL:
    global _library
    if _library is None:
        _library = LIBRARY.load(_SIGNATURES)
    return _library


_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}  # kvf_linear_has_vector_kernel's


def has_vector_kernel(dtype: torch.dtype) -> bool:
    """Whether this CPU runs the kernel written for its vector instructions for weights of `dtype` (AVX-512 for
    float32, AVX-512 BF16 for bfloat16, AVX-512 VNNI for int8); else a plain C one runs, compiled for the CPU's
    vector width, with the same results (int8: the same bits)."""
    return bool(_loaded().kvf_linear_has_vector_kernel(_KINDS[dtype]))


@dataclass(frozen=True)
class PackedWeight:
    """A weight [N, K] in the C kernel's layout, from `pack`: outputs in tiles of TILE (zeros past N),
    bfloat16 as k pairs side by side ([tiles, ceil(K/2), TILE, 2], a zero past an odd K), float32 as [tiles, K,
    TILE], int8 as k quads side by side in unsigned bytes, value + 128 ([tiles, K' / 4, TILE, 4], K' = K
    rounded up to QUANT_BLOCK, zeros past K); int8 with its outputs' float32 scales ([N]), None for the others."""

    tiles: torch.Tensor
    out_features: int
    in_features: int
    scales: torch.Tensor | None = None


def pack(weight: torch.Tensor, scales: torch.Tensor | None = None) -> PackedWeight:
    """The weight [N, K] in the C kernel's layout (see PackedWeight); int8 weights with their [N] scales."""
    n, k = weight.shape
    tiles = -(-n // TILE)
    if (weight.dtype == torch.int8) != (scales is not None):
        raise ValueError("int8 weights come with their scales, and only they do")
    if weight.dtype == torch.bfloat16:
        padded = F.pad(weight, (0, k % 2, 0, tiles * TILE - n))
        packed = padded.view(tiles, TILE, -1, 2).transpose(1, 2).contiguous()
    elif weight.dtype == torch.float32:
        packed = F.pad(weight, (0, 0, 0, tiles * TILE - n)).view(tiles, TILE, k).transpose(1, 2).contiguous()
    elif weight.dtype == torch.int8:
        unsigned = (weight.to(torch.int16) + _INT8_OFFSET).to(torch.uint8)
        padded_k = -(-k // QUANT_BLOCK) * QUANT_BLOCK
        padded = F.pad(unsigned, (0, padded_k - k, 0, tiles * TILE - n), value=_INT8_OFFSET)
        packed = padded.view(tiles, TILE, padded_k // 4, 4).transpose(1, 2).contiguous()
    else:
        raise ValueError(f"the CPU linear kernel takes bfloat16, float32 or int8 weights, not {weight.dtype}")
    if scales is not None:
        scales = scales.to(torch.float32).contiguous()
        if scales.shape != (n,):
            raise ValueError(f"int8 weights take one scale an output row: [{n}], got {tuple(scales.shape)}")
    return PackedWeight(packed, n, k, scales)


def unpack(weight: PackedWeight) -> torch.Tensor:
    """The weight [N, K] that `pack` took (int8: its values, without the scales)."""
    tiles = weight.tiles
    if tiles.dim() == 4:  # bfloat16's k pairs, int8's k quads
        tiles = tiles.transpose(2, 3).reshape(tiles.shape[0], -1, TILE)
    unpacked = tiles.transpose(1, 2).reshape(-1, tiles.shape[1])[: weight.out_features, : weight.in_features]
    if unpacked.dtype == torch.uint8:
        return (unpacked.to(torch.int16) - _INT8_OFFSET).to(torch.int8)
    return unpacked


def quantized_rows(x: torch.Tensor) -> torch.Tensor:
    """x [rows, K] as the int8 kernel multiplies it, in float64: each row's blocks of QUANT_BLOCK quantized to
    int8 values on the block's own scale (its largest magnitude / 127, round to nearest even), times that
    scale. The C file's float32 arithmetic step by step: the reference its int8 results are checked against."""
    rows, k = x.shape
    blocks = F.pad(x.float(), (0, -k % QUANT_BLOCK)).view(rows, -1, QUANT_BLOCK)
    scales = blocks.abs().amax(dim=-1, keepdim=True) / 127
    inverses = torch.where(scales > 0, 1 / scales, torch.zeros_like(scales))
    values = torch.round(blocks * inverses)
    return (values.double() * scales.double()).view(rows, -1)[:, :k]


def linear(x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None = None, threads: int = 1,
           portable: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """x @ W.T + bias for x [rows, K] packed, W given packed, on `threads` threads, into `out` ([rows, N]
    packed) or a new tensor, all in x's dtype: the weight's, or bfloat16 or float32 for int8 weights, whose
    products are scaled by their output's scale; `portable` takes the plain C kernel where the vector one
    would run (tests). The checks are plain comparisons: a decode step makes 121 of these calls."""
    tiles, n, scales = weight.tiles, weight.out_features, weight.scales
    dtype_fits = (x.dtype in DTYPES) if scales is not None else x.dtype == tiles.dtype
    if x.dim() != 2 or not dtype_fits or not x.is_contiguous() or x.shape[1] != weight.in_features:
        raise ValueError(f"x must be a packed [rows, {weight.in_features}] tensor of the weight's dtype "
                         "(bfloat16 or float32 for int8 weights)")  # fmt: skip
    if bias is not None and (bias.dtype != x.dtype or not bias.is_contiguous() or bias.shape != (n,)):
        raise ValueError("the bias must be a packed [N] tensor of x's dtype")
    rows = x.shape[0]
    if out is None:
        out = torch.empty(rows, n, dtype=x.dtype)
    elif out.dtype != x.dtype or not out.is_contiguous() or out.shape != (rows, n):
        raise ValueError("out must be a packed [rows, N] tensor of x's dtype")
    library = _library or _loaded()
    bias_pointer, bf16 = None if bias is None else bias.data_ptr(), x.dtype == torch.bfloat16
    if scales is not None:
        status = library.kvf_linear_int8(x.data_ptr(), tiles.data_ptr(), scales.data_ptr(), bias_pointer,
                                         out.data_ptr(), rows, weight.in_features, n, threads, portable, bf16)  # fmt: skip
        if status:
            raise MemoryError(f"no memory to quantize {rows} rows of {weight.in_features} for int8 weights")
        return out
    kernel = library.kvf_linear_bf16 if bf16 else library.kvf_linear_f32
    kernel(x.data_ptr(), tiles.data_ptr(), bias_pointer, out.data_ptr(), rows, weight.in_features, n, threads,
           portable)  # fmt: skip
    return out
