"""Fused residual-add + RMSNorm in Triton, one program per row (a token, or one head of a token).

Rounding follows reference.rms_norm step by step: the residual sum is rounded to the input dtype, the
variance is taken in float32, the normalized row is rounded to the input dtype before the weight
multiplies it. A product or sum of two 16-bit floats done in float32 and rounded once is exactly the
16-bit operation torch does, so 16-bit outputs agree with the reference to within one ulp (rsqrt's last bit can differ).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvferry.kernels import pdl
from kvferry.kernels.pdl import wait_for_predecessor


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    residual_out_ptr,
    stride_x_row,
    stride_x_head,
    stride_x_col,
    stride_r_row,
    stride_r_head,
    stride_r_col,
    stride_o_row,
    stride_o_head,
    stride_ro_row,
    stride_ro_head,
    num_cols,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    row, head = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    mask = cols < num_cols
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # before the wait: nothing writes it
    wait_for_predecessor(PDL)
    x = tl.load(x_ptr + row * stride_x_row + head * stride_x_head + cols * stride_x_col, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        offsets = row * stride_r_row + head * stride_r_head + cols * stride_r_col
        x = (x.to(tl.float32) + tl.load(residual_ptr + offsets, mask=mask, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(residual_out_ptr + row * stride_ro_row + head * stride_ro_head + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    variance = tl.sum(x32 * x32, axis=0) / num_cols
    normalized = (x32 * tl.rsqrt(variance + eps)).to(x.dtype).to(tl.float32)
    out = weight * normalized
    tl.store(out_ptr + row * stride_o_row + head * stride_o_head + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def _as_3d(t: torch.Tensor) -> torch.Tensor:
    """A 2-D input is a 3-D one with one head per row: one kernel serves rms_norm and head_rms_norm."""
    return t if t.dim() == 3 else t.unsqueeze(1)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm over the last dim of x [rows, cols] or [rows, heads, cols]; returns
    (normalized, new residual), the new residual being x itself when no residual is given. `out` and
    `residual_out` (contiguous, x's shape) receive the results when given."""
    if x.dim() not in (2, 3):
        raise ValueError(f"rms_norm takes [rows, cols] or [rows, heads, cols], got shape {tuple(x.shape)}")
    if out is None:
        out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if residual is not None and residual_out is None:
        residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    new_residual = x if residual is None else residual_out
    x3, out3 = _as_3d(x), _as_3d(out)
    res3 = x3 if residual is None else _as_3d(residual)
    res_out3 = x3 if residual_out is None else _as_3d(residual_out)
    rows, heads, cols = x3.shape
    if rows * heads == 0:
        return out, new_residual
    use_pdl = pdl.enabled(x)
    _rms_norm_kernel[(rows, heads)](
        x3,
        res3,
        weight.contiguous(),
        out3,
        res_out3,
        *x3.stride(),
        *res3.stride(),
        out3.stride(0),
        out3.stride(1),
        res_out3.stride(0),
        res_out3.stride(1),
        cols,
        eps,
        HAS_RESIDUAL=residual is not None,
        BLOCK=triton.next_power_of_2(cols),
        PDL=use_pdl,
        launch_pdl=use_pdl,
    )
    return out, new_residual


def head_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm over the last dim of [tokens, heads, head_dim] (Qwen3's q/k norm)."""
    return rms_norm(x, weight, eps, out=out)[0]
