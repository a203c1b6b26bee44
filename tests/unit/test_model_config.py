import pytest

from kvferry.engine.model_config import ModelConfig, UnsupportedModelError
from kvferry.engine.rope import inverse_frequencies

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def test_unknown_architecture_is_named():
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        ModelConfig.from_dict({**BASE, "architectures": ["GPT2LMHeadModel"]})


@pytest.mark.parametrize("key", ["attn_logit_softcapping", "mlp_bias"])
def test_unsupported_key_is_named(key):
    with pytest.raises(UnsupportedModelError, match=key):
        ModelConfig.from_dict({**BASE, key: {"x": 1}})


def _compressed_tensors(strategy, kind="float"):
    weights = {"num_bits": 8, "type": kind, "strategy": strategy, "symmetric": True}
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "config_groups": {"group_0": {"weights": weights, "targets": ["Linear"]}}, "ignore": ["lm_head"]}  # fmt: skip


@pytest.mark.parametrize("quantization_config", [_compressed_tensors("tensor"), _compressed_tensors("channel"),
                                                 {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}])  # fmt: skip
def test_fp8_checkpoints_with_tensor_or_channel_scales_are_read_as_fp8(quantization_config):
    assert ModelConfig.from_dict({**BASE, "quantization_config": quantization_config}).quantization == "fp8"
    assert ModelConfig.from_dict(BASE).quantization is None


@pytest.mark.parametrize(("quantization_config", "named"), [
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "block-wise"),
    ({"quant_method": "gptq", "bits": 4}, "gptq"),
    (_compressed_tensors("group", kind="int"), "compressed-tensors"),
])  # fmt: skip
def test_other_quantizations_are_refused_by_name(quantization_config, named):
    with pytest.raises(UnsupportedModelError, match=named):
        ModelConfig.from_dict({**BASE, "quantization_config": quantization_config})


def test_unsupported_rope_type_is_named():
    with pytest.raises(UnsupportedModelError, match="yarn"):
        ModelConfig.from_dict({**BASE, "rope_scaling": {"rope_type": "yarn", "factor": 2.0}})


def test_mistral_sliding_window_shorter_than_context_is_refused():
    raw = {**BASE, "architectures": ["MistralForCausalLM"], "sliding_window": 512, "max_position_embeddings": 4096}
    with pytest.raises(UnsupportedModelError, match="sliding_window"):
        ModelConfig.from_dict(raw)
    assert ModelConfig.from_dict({**raw, "sliding_window": None}).family == "mistral"


def test_family_flags_and_both_rope_spellings():
    qwen2 = ModelConfig.from_dict({**BASE, "architectures": ["Qwen2ForCausalLM"], "rope_theta": 1e6})
    assert (qwen2.qkv_bias, qwen2.qk_norm, qwen2.head_dim, qwen2.rope.theta) == (True, False, 16, 1e6)
    qwen3 = ModelConfig.from_dict(
        {**BASE, "architectures": ["Qwen3ForCausalLM"], "head_dim": 32, "rope_parameters": {"rope_type": "default", "rope_theta": 5.0}}
    )
    assert (qwen3.qkv_bias, qwen3.qk_norm, qwen3.head_dim, qwen3.rope.theta) == (False, True, 32, 5.0)


def test_llama3_scaling_slows_only_long_wavelengths():
    plain = ModelConfig.from_dict(BASE).rope
    scaled = ModelConfig.from_dict(
        {**BASE, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}
    ).rope
    base, llama3 = inverse_frequencies(plain, 16), inverse_frequencies(scaled, 16)
    assert llama3[0] == base[0]  # the highest frequency is kept
    assert llama3[-1] == pytest.approx(base[-1] / 8.0)  # the lowest is divided by the factor
