"""Which device an engine runs on, and making it the current one.

CUDA's current device is per host thread and starts at GPU 0. Tensors made with an explicit `cuda:1` land on
GPU 1 either way, but everything that goes by the current device does not: Triton launches, CUDA graph
capture, `torch.cuda.synchronize()`, events, and the CUDA context UCX finds when it is initialized. So an
engine on `cuda:N` makes N current in every thread that drives it (`make_current`).
"""

from __future__ import annotations

import torch


def resolve_device(spec: str, cuda_count: int) -> torch.device:
    """`spec` ("auto", "cpu", "cuda", "cuda:N") as a device with an explicit index, checked against the
    `cuda_count` GPUs this process sees. "auto" and "cuda" mean GPU 0: always the same card, whatever
    device another engine in this process made current."""
    if spec == "auto":
        spec = "cuda" if cuda_count > 0 else "cpu"
    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {spec!r}") from exc
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {spec!r}")
    index = 0 if device.index is None else device.index
    if cuda_count == 0:
        raise ValueError(f"device {spec!r} asks for a GPU, but this process sees none (torch.cuda.device_count() is 0)")
    if index >= cuda_count:
        visible = "GPU 0 (cuda:0)" if cuda_count == 1 else f"{cuda_count} GPUs (cuda:0 to cuda:{cuda_count - 1})"
        raise ValueError(f"device {spec!r} does not exist: this process sees {visible}")
    return torch.device("cuda", index)


def make_current(device: torch.device) -> None:
    """Make a CUDA device current in the calling thread (a no-op on the CPU). Cheap when it already is:
    the runtime compares before it switches."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
