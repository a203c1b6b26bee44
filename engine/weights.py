"""Load a Hugging Face checkpoint's safetensors (one file, or shards with their index) into ModelWeights.

Linear layers come as FP8 (kernels/fp8_weight.py) where the checkpoint stores them so, each `*.weight`
beside its `*.weight_scale`, or in the format `quantize` names (QUANTIZERS), quantized at load; embeddings
and norms keep the model's dtype, and so does the LM head except in int8 and int4, where it is int8: on a
CPU the head is a fifth of a small model's bytes, and the largest single read of a decode step. In int4 it is
not 4-bit: that cost the real model a tenth of its top-1 agreement with float32 (87% against 96.5%,
tests/integration/test_cpu_quantized_weights.py); in int8, as llama.cpp's Q4 files keep it in Q8_0, the
agreement stayed 96.5%.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open

from kvferry.engine.model import LayerWeights, ModelWeights
from kvferry.engine.model_config import ModelConfig
from kvferry.kernels.dispatch import LinearWeight
from kvferry.kernels.fp8_weight import fp8_from_checkpoint, quantize_fp8, stack_fp8
from kvferry.kernels.int4_linear import quantize_int4
from kvferry.kernels.int8_linear import quantize_int8

INDEX_FILE = "model.safetensors.index.json"
# EngineArgs.quantization's formats: each turns a 16/32-bit linear weight into the form the kernels read.
QUANTIZERS: dict[str, Callable[[torch.Tensor], LinearWeight]] = {
    "fp8": quantize_fp8, "int8": quantize_int8, "int4": quantize_int4,
}
# Formats whose LM head is quantized too, and how.
LM_HEAD_QUANTIZERS: dict[str, Callable[[torch.Tensor], LinearWeight]] = {
    "int8": quantize_int8, "int4": quantize_int8,
}


def share_weights_file(path: Path) -> None:
    """Make a written weights file readable by everyone, as a model folder's other files are.

    safetensors creates its files readable by their owner alone (0600); a model folder is read by other
    users too (the image's non-root pods, a hostPath volume mounted into them), which then fail to open it.
    """
    path.chmod(0o644)


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / INDEX_FILE
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / name for name in shards]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} holds no *.safetensors files")
    return files


class _TensorSource:
    """Every tensor of the checkpoint by name, read straight onto the target device (safetensors maps the
    file and copies each tensor there; no host copy of the model is ever assembled) and converted there,
    so a full-precision copy lives only as long as one tensor."""

    def __init__(self, model_dir: Path, dtype: torch.dtype, device: torch.device, quantize: str | None) -> None:
        self.dtype, self.device = dtype, device
        self.quantizer = QUANTIZERS[quantize] if quantize else None
        self.location: dict[str, Path] = {}
        for path in checkpoint_files(model_dir):
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    self.location[name] = path
        self._handles: dict[Path, object] = {}

    def has(self, name: str) -> bool:
        return name in self.location

    def stored(self, name: str) -> torch.Tensor:
        """The tensor as the checkpoint stores it, on the target device."""
        if name not in self.location:
            raise KeyError(f"checkpoint lacks tensor {name!r}")
        path = self.location[name]
        if path not in self._handles:
            self._handles[path] = safe_open(str(path), framework="pt", device=str(self.device))
        return self._handles[path].get_tensor(name).to(self.device)  # type: ignore[attr-defined]

    def get(self, name: str) -> torch.Tensor:
        return self.stored(name).to(dtype=self.dtype)

    def cat(self, *names: str) -> torch.Tensor:
        return torch.cat([self.get(name) for name in names], dim=0)

    def linear(self, *names: str) -> LinearWeight:
        """A linear layer's weight, the `names` stacked by rows: FP8 as stored, or quantized, else dtype."""
        if any(self.has(name + "_scale_inv") for name in names):
            raise ValueError(f"{names[0]} has block-wise FP8 scales (weight_scale_inv), which kvferry does not read")
        stored_fp8 = [self.has(name + "_scale") for name in names]
        if any(stored_fp8):
            if not all(stored_fp8):
                raise ValueError(f"of {', '.join(names)}, some are FP8 and some are not: they cannot share one matmul")
            return stack_fp8([fp8_from_checkpoint(self.stored(name), self.stored(name + "_scale")) for name in names])
        weight = self.cat(*names)
        return self.quantizer(weight) if self.quantizer else weight


def load_weights(model_dir: str | Path, config: ModelConfig, dtype: torch.dtype, device: torch.device,
                 quantize: str | None = None) -> ModelWeights:  # fmt: skip
    """`quantize`: a QUANTIZERS format the linear layers stored in 16 or 32 bits become at load."""
    source = _TensorSource(Path(model_dir), dtype, device, quantize)
    layers = []
    for i in range(config.num_layers):
        prefix = f"model.layers.{i}."
        attn = prefix + "self_attn."
        layers.append(
            LayerWeights(
                input_norm=source.get(prefix + "input_layernorm.weight"),
                qkv=source.linear(attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"),
                qkv_bias=source.cat(attn + "q_proj.bias", attn + "k_proj.bias", attn + "v_proj.bias")
                if config.qkv_bias
                else None,
                q_norm=source.get(attn + "q_norm.weight") if config.qk_norm else None,
                k_norm=source.get(attn + "k_norm.weight") if config.qk_norm else None,
                o_proj=source.linear(attn + "o_proj.weight"),
                post_attention_norm=source.get(prefix + "post_attention_layernorm.weight"),
                gate_up=source.linear(prefix + "mlp.gate_proj.weight", prefix + "mlp.up_proj.weight"),
                down=source.linear(prefix + "mlp.down_proj.weight"),
            )
        )
    embed = source.get("model.embed_tokens.weight")
    tied = config.tie_word_embeddings or not source.has("lm_head.weight")
    return ModelWeights(
        embed_tokens=embed,
        layers=layers,
        final_norm=source.get("model.norm.weight"),
        lm_head=_lm_head(embed if tied else source.get("lm_head.weight"), quantize),
    )


def _lm_head(weight: torch.Tensor, quantize: str | None) -> LinearWeight:
    quantizer = LM_HEAD_QUANTIZERS.get(quantize or "")
    return quantizer(weight) if quantizer else weight
