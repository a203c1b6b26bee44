"""The devices' facts, saved as the results file's environment."""

from __future__ import annotations

import torch

from benchmarks.harness.environment import environment


def facts(devices: list[str]) -> dict[str, object]:
    """GPU names, driver, torch/triton versions, and whether the two GPUs reach each other directly."""
    on_gpu = [torch.device(d) for d in devices if d.startswith("cuda")]
    if on_gpu:
        # nvidia-smi's names and driver, triton and transformers versions
        from benchmarks.gpu_serving import gpu_facts

        found = gpu_facts()
    else:
        found = {
            **environment(),
            "nvidia_smi": None,
            "triton": _version("triton"),
            "cuda_runtime": torch.version.cuda,
        }
    found["devices"] = {d: torch.cuda.get_device_name(d) if d.startswith("cuda") else "cpu" for d in devices}
    if len({d.index for d in on_gpu}) == 2:
        found["peer_access"] = torch.cuda.can_device_access_peer(on_gpu[0].index, on_gpu[1].index)
    return found


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None
