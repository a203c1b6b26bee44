"""Write a checkpoint's FP8 version in Hugging Face's compressed-tensors layout: each linear layer's
`weight` in float8_e4m3fn beside its `weight_scale` (per tensor: one value; per channel: [rows, 1]), the
rest as it was, and `quantization_config` in config.json. What an FP8 model from the Hub looks like."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from kvferry.kernels.fp8_weight import quantize_fp8, quantize_rows

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _per_tensor(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale for the whole tensor: its rows quantized as one row."""
    data, scale = quantize_rows(weight.reshape(1, -1))
    return data.reshape(weight.shape), scale.reshape(())


def write_fp8_checkpoint(source: Path, target: Path, strategy: str) -> Path:
    """`strategy`: "tensor" or "channel". Per-channel scales are exactly quantize_fp8's."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
    tensors = {}
    for path in sorted(source.glob("*.safetensors")):
        tensors |= load_file(path)
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(".weight") and name.split(".")[-2] in LINEARS:
            if strategy == "tensor":
                data, scale = _per_tensor(tensor)
            else:
                quantized = quantize_fp8(tensor)
                data, scale = quantized.data, quantized.scale[:, None]
            out[name], out[name + "_scale"] = data, scale
        else:
            out[name] = tensor
    save_file(out, target / "model.safetensors")
    config = json.loads((source / "config.json").read_text())
    weights = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False}
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": {"weights": weights, "targets": ["Linear"]}},
        "ignore": ["lm_head"],
    }
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return target
