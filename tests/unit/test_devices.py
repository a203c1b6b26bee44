"""Device resolution and validation (engine/devices.py): pure logic, run without CUDA by passing the GPU count."""

from __future__ import annotations

import pytest
import torch

from kvferry.engine import EngineArgs
from kvferry.engine.devices import make_current, resolve_device


@pytest.mark.parametrize(
    ("spec", "cuda_count", "expected"),
    [
        ("auto", 0, torch.device("cpu")),
        ("auto", 2, torch.device("cuda", 0)),
        ("cpu", 2, torch.device("cpu")),
        ("cuda", 1, torch.device("cuda", 0)),
        ("cuda:0", 1, torch.device("cuda", 0)),
        ("cuda:1", 2, torch.device("cuda", 1)),
        ("cuda:7", 8, torch.device("cuda", 7)),
    ],
)
def test_a_device_resolves_to_an_explicit_index(spec, cuda_count, expected):
    device = resolve_device(spec, cuda_count)
    assert device == expected
    assert device.type == "cpu" or device.index is not None


def test_an_index_past_the_last_gpu_says_how_many_there_are():
    with pytest.raises(ValueError, match=r"'cuda:3' does not exist: this process sees 2 GPUs \(cuda:0 to cuda:1\)"):
        resolve_device("cuda:3", 2)
    with pytest.raises(ValueError, match=r"'cuda:1' does not exist: this process sees GPU 0 \(cuda:0\)"):
        resolve_device("cuda:1", 1)


def test_asking_for_a_gpu_without_one_is_an_error():
    for spec in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match="sees none"):
            resolve_device(spec, 0)


@pytest.mark.parametrize("spec", ["gpu", "cuda:-1", "cuda:x", "meta", ""])
def test_malformed_devices_are_refused(spec):
    with pytest.raises(ValueError, match="device must be"):
        resolve_device(spec, 2)


def test_engine_args_check_the_index_against_this_process_gpus():
    visible = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"cuda:{visible}' does not exist|sees none"):
        EngineArgs(device=f"cuda:{visible}").resolve_device()
    assert EngineArgs(device="cpu").resolve_device() == torch.device("cpu")


def test_making_the_cpu_current_leaves_cuda_uninitialized():
    make_current(torch.device("cpu"))
    assert not torch.cuda.is_initialized()
