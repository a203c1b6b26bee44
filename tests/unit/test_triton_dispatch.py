"""Which side a kernel call takes: KVFERRY_KERNELS and the tensor's device."""

from __future__ import annotations

import pytest
import torch

from kvferry.kernels.dispatch import BACKEND_VARIABLE, use_triton


@pytest.mark.parametrize(("setting", "expected"), [(None, False), ("auto", False), ("torch", False), ("triton", True)])
def test_cpu_tensors_take_torch_unless_triton_is_forced(setting, expected, monkeypatch):
    if setting is None:
        monkeypatch.delenv(BACKEND_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(BACKEND_VARIABLE, setting)
    assert use_triton(torch.ones(1)) is expected


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("setting", "expected"), [("auto", True), ("torch", False), ("triton", True)])
def test_cuda_tensors_take_triton_unless_torch_is_forced(setting, expected, monkeypatch):
    monkeypatch.setenv(BACKEND_VARIABLE, setting)
    assert use_triton(torch.ones(1, device="cuda")) is expected


def test_an_unknown_setting_is_refused(monkeypatch):
    monkeypatch.setenv(BACKEND_VARIABLE, "cuda")
    with pytest.raises(ValueError, match="KVFERRY_KERNELS must be one of"):
        use_triton(torch.ones(1))
