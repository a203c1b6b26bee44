"""Programmatic dependent launch (PDL, compute capability 9.0 and later) for the decode step's Triton kernels.

A batch-1 decode step of an 8B model is about 290 kernels of 3 to 80 microseconds, one after another. Each
normally starts only once the one before has ended and its writes are flushed, and then spends its first
microsecond or two fetching before it computes: at batch 1 that ramp is a tenth of the step. A kernel
launched with PDL may start while the kernel before it runs its last wave. Its programs first fetch what no
kernel writes (the weights), then wait for the kernel before to complete (`gdc_wait`: its writes are then
visible), and once past that wait let the next kernel launch in turn (`gdc_launch_dependents`).

The rule that keeps it correct: a kernel launched with PDL calls `wait_for_predecessor` on every path before
it reads anything another kernel writes and before it stores anything (the caching allocator may hand the
kernel before's input to this kernel's output). Only weights, which nothing writes during a step, are read
before it. Kernels launched the ordinary way (cuBLAS, torch's own) wait for everything before them as always.

`KVFERRY_PDL=0` launches every kernel the ordinary way (the benchmarks' baseline); Triton's interpreter never
uses PDL.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

VARIABLE = "KVFERRY_PDL"


@functools.cache
def _supported(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def enabled(tensor: torch.Tensor) -> bool:
    """Whether kernels over this tensor launch with PDL: a CUDA device that has it, unless KVFERRY_PDL=0."""
    return tensor.is_cuda and os.environ.get(VARIABLE, "1") != "0" and _supported(tensor.device.index or 0)


@triton.jit
def wait_for_predecessor(PDL: tl.constexpr):
    """Wait until the kernel before has completed, then let the next kernel launch (a no-op without PDL)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
