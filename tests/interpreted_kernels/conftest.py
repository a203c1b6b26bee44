"""Triton kernels on the CPU, through Triton's interpreter.

TRITON_INTERPRET is read when `@triton.jit` decorates a kernel, that is when a kernel module is first
imported, so it has to be set for the whole process before that, and must not reach the other tests'
processes. These tests therefore run in a process of their own, started with the variable set by
tests/unit/test_triton_interpreter.py (or by hand: `TRITON_INTERPRET=1 python -m pytest tests/interpreted_kernels`);
a pytest process without it collects nothing here.
"""

from __future__ import annotations

import os

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
collect_ignore_glob = [] if INTERPRETING else ["test_*.py"]


def _widen_bfloat16_dot_operands() -> None:
    """The interpreter keeps bfloat16 values as their raw uint16 bits and its `tl.dot` multiplies those
    bits as integers (seen in triton 3.9), so every bfloat16 dot came out as garbage. Widening the operands
    to float32 first is exact (bfloat16 is float32's upper half) and is what the GPU's dot does."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    original = InterpreterBuilder.create_dot

    def widen(handle: TensorHandle) -> TensorHandle:
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        as_float = (handle.data.astype(np.uint32) << 16).view(np.float32)
        return TensorHandle(as_float, tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    InterpreterBuilder.create_dot = create_dot


if INTERPRETING:
    _widen_bfloat16_dot_operands()
