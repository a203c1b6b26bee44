"""The model's shape, read from a Hugging Face `config.json`, with a clear error for what we cannot run."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# architecture name in config.json -> family; families differ only in the flags below.
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
# Keys that change the math in ways this engine does not implement; silently ignoring them would give
# wrong tokens, so they are refused by name.
UNSUPPORTED_KEYS = ("attn_logit_softcapping", "final_logit_softcapping", "mlp_bias")


class UnsupportedModelError(ValueError):
    """The checkpoint needs something the engine does not implement; the message names it."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    torch_dtype: str
    # "fp8": the checkpoint stores its linear layers in FP8 e4m3 with per-tensor or per-channel scales.
    quantization: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{model_dir} has no config.json: not a Hugging Face model folder")
        return cls.from_dict(json.loads(path.read_text()))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        architecture = (raw.get("architectures") or [None])[0]
        if architecture not in ARCHITECTURES:
            raise UnsupportedModelError(
                f"architecture {architecture!r} is not supported; supported: {', '.join(ARCHITECTURES)}"
            )
        family = ARCHITECTURES[architecture]
        for key in UNSUPPORTED_KEYS:
            if raw.get(key):
                raise UnsupportedModelError(f"config key {key!r} is not supported by kvferry's engine")
        _refuse_sliding_window(raw, family)
        num_heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // num_heads
        eos = raw.get("eos_token_id")
        return cls(
            architecture=architecture,
            family=family,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            max_position_embeddings=raw.get("max_position_embeddings", 4096),
            rope=_rope_config(raw),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v biases; Llama-style configs say so with attention_bias.
            qkv_bias=family == "qwen2" or bool(raw.get("attention_bias", False)),
            qk_norm=family == "qwen3",
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
            quantization=_checkpoint_quantization(raw.get("quantization_config")),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
        )


def _checkpoint_quantization(config: dict[str, Any] | None) -> str | None:
    """"fp8" for the Hugging Face FP8 layouts with one scale per tensor or per output channel
    (compressed-tensors' float-quantized 8-bit weights, fbgemm_fp8); any other quantization is refused."""
    if not config:
        return None
    method = config.get("quant_method")
    if method == "fbgemm_fp8":
        return "fp8"
    if method == "compressed-tensors":
        groups = (config.get("config_groups") or {}).values()
        weights = [group.get("weights") or {} for group in groups]
        if weights and all(w.get("type") == "float" and w.get("num_bits") == 8 and w.get("strategy") in ("tensor", "channel")
                           for w in weights):  # fmt: skip
            return "fp8"
        raise UnsupportedModelError("only FP8 weights with per-tensor or per-channel scales are supported among "
                                    f"compressed-tensors checkpoints, got weights {weights}")  # fmt: skip
    detail = " (block-wise scales)" if config.get("weight_block_size") else ""
    raise UnsupportedModelError(f"quantization {method!r}{detail} is not supported; supported: FP8 weights with "
                                "per-tensor or per-channel scales (compressed-tensors, fbgemm_fp8)")  # fmt: skip


def _refuse_sliding_window(raw: dict[str, Any], family: str) -> None:
    window = raw.get("sliding_window")
    uses_window = raw.get("use_sliding_window", family == "mistral")
    if window and uses_window and window < raw.get("max_position_embeddings", 0):
        raise UnsupportedModelError(
            f"config key 'sliding_window' ({window}) is not supported: kvferry attends over the full context"
        )


def _rope_config(raw: dict[str, Any]) -> RopeConfig:
    # transformers >= 5 writes `rope_parameters`; older checkpoints write rope_theta + rope_scaling.
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"config key 'rope_scaling' type {rope_type!r} is not supported; supported: {SUPPORTED_ROPE_TYPES}"
        )
    return RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )
