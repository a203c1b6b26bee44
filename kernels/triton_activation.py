"""SiLU-and-mul in Triton: out = silu(gate) * up for gate_up = [gate | up] along the last dim.

silu is computed in float32 and rounded to the input dtype before the product, as torch's F.silu(gate) * up.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvferry.kernels import pdl
from kvferry.kernels.pdl import wait_for_predecessor

BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(
    gate_up_ptr, out_ptr, stride_in_row, stride_in_col, stride_out_row, width, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    wait_for_predecessor(PDL)
    row, chunk = tl.program_id(0), tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    src = gate_up_ptr + row * stride_in_row
    gate = tl.load(src + cols * stride_in_col, mask=mask, other=0.0)
    up = tl.load(src + (cols + width) * stride_in_col, mask=mask, other=0.0)
    gate32 = gate.to(tl.float32)
    silu = (gate32 / (1.0 + tl.exp(-gate32))).to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_out_row + cols, (silu * up.to(tl.float32)).to(gate.dtype), mask=mask)


def silu_and_mul(gate_up: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """gate_up [..., 2 * width] -> [..., width]; `out` (contiguous) receives it when given."""
    width = gate_up.shape[-1] // 2
    if out is None:
        out = torch.empty((*gate_up.shape[:-1], width), dtype=gate_up.dtype, device=gate_up.device)
    rows_in, rows_out = gate_up.reshape(-1, 2 * width), out.view(-1, width)
    if rows_in.shape[0] == 0:
        return out
    grid = (rows_in.shape[0], triton.cdiv(width, BLOCK))
    use_pdl = pdl.enabled(gate_up)
    _silu_and_mul_kernel[grid](gate_up_ptr=rows_in, out_ptr=rows_out, stride_in_row=rows_in.stride(0),
                               stride_in_col=rows_in.stride(1), stride_out_row=rows_out.stride(0),
                               width=width, BLOCK=BLOCK, PDL=use_pdl, launch_pdl=use_pdl)  # fmt: skip
    return out
