"""`kvferry make-model`: write a small Hugging Face checkpoint with deterministic random weights.

No weights can be downloaded here, so tests, benchmarks and the local demo run on checkpoints this module
writes: real architecture shapes and file formats (config.json, safetensors, tokenizer.json trained with
`tokenizers` on the corpus in kvferry/data, tokenizer_config.json with a chat template). Their text is
random: the weights are.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from kvferry.engine.model_shapes import SIZES, ModelShape
from kvferry.engine.weights import INDEX_FILE, share_weights_file

ARCHS = ("llama", "qwen2", "qwen3")
BOS, EOS, IM_START, IM_END = "<|begin_of_text|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END, BOS]
TOKENIZER_VOCAB = 2048
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


ARCH_NAMES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def train_tokenizer(arch: str) -> Tokenizer:
    corpus = resources.files("kvferry").joinpath("data/corpus.txt").read_text(encoding="utf-8")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus.splitlines(keepends=True), trainer)
    if arch == "llama":  # Llama tokenizers put a BOS token in front of every prompt
        bos_id = tokenizer.token_to_id(BOS)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
        )
    return tokenizer


def _hf_config(arch: str, shape: ModelShape, vocab_size: int, tokenizer: Tokenizer, dtype: str) -> dict:
    config = {
        "architectures": [ARCH_NAMES[arch]],
        "model_type": arch,
        "vocab_size": vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 500000.0 if arch == "llama" else 1000000.0,
        "tie_word_embeddings": arch == "qwen2",
        "torch_dtype": dtype,
        "bos_token_id": tokenizer.token_to_id(BOS),
        "eos_token_id": tokenizer.token_to_id(IM_END),
        "attention_bias": False,
        "use_cache": True,
    }
    if arch == "llama":  # exercise Llama-3.1 rope scaling
        config["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": shape.rope_original_context,
        }
    if arch in ("qwen2", "qwen3"):
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=shape.num_layers)
    return config


def random_weights(
    arch: str, shape: ModelShape, vocab_size: int, seed: int, dtype: torch.dtype, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """Deterministic for a given seed and device (CUDA draws other numbers than the CPU). Linear weights
    get std 1/sqrt(fan_in) so activations stay O(1) and logits are sharp, which keeps greedy choices far
    from ties. Drawing on the GPU makes an 8B checkpoint in seconds where the CPU takes minutes."""
    generator = torch.Generator(device).manual_seed(seed)

    def normal(*size: int, std: float) -> torch.Tensor:
        return (torch.randn(*size, generator=generator, device=device) * std).to(dtype)

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return normal(out_features, in_features, std=in_features**-0.5)

    def norm(size: int) -> torch.Tensor:
        return (1.0 + torch.randn(size, generator=generator, device=device) * 0.1).to(dtype)

    h, q_size, kv_size = shape.hidden_size, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    tensors = {"model.embed_tokens.weight": normal(vocab_size, h, std=1.0)}
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = norm(h)
        tensors[p + "self_attn.q_proj.weight"] = linear(q_size, h)
        tensors[p + "self_attn.k_proj.weight"] = linear(kv_size, h)
        tensors[p + "self_attn.v_proj.weight"] = linear(kv_size, h)
        if arch == "qwen2":
            for name, size in (("q", q_size), ("k", kv_size), ("v", kv_size)):
                tensors[p + f"self_attn.{name}_proj.bias"] = normal(size, std=0.1)
        if arch == "qwen3":
            tensors[p + "self_attn.q_norm.weight"] = norm(shape.head_dim)
            tensors[p + "self_attn.k_norm.weight"] = norm(shape.head_dim)
        tensors[p + "self_attn.o_proj.weight"] = linear(h, q_size)
        tensors[p + "post_attention_layernorm.weight"] = norm(h)
        tensors[p + "mlp.gate_proj.weight"] = linear(shape.intermediate_size, h)
        tensors[p + "mlp.up_proj.weight"] = linear(shape.intermediate_size, h)
        tensors[p + "mlp.down_proj.weight"] = linear(h, shape.intermediate_size)
    tensors["model.norm.weight"] = norm(h)
    if arch != "qwen2":  # qwen2 ties lm_head to the embeddings
        tensors["lm_head.weight"] = linear(vocab_size, h)
    return tensors


def _on_host(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.cpu() for name, tensor in tensors.items()}


def _save_shards(tensors: dict[str, torch.Tensor], out: Path, num_shards: int) -> None:
    if num_shards <= 1:
        save_file(_on_host(tensors), str(out / "model.safetensors"), metadata={"format": "pt"})
        share_weights_file(out / "model.safetensors")
        return
    names = list(tensors)
    weight_map = {}
    for shard in range(num_shards):
        file_name = f"model-{shard + 1:05d}-of-{num_shards:05d}.safetensors"
        part = {name: tensors[name] for name in names[shard::num_shards]}
        save_file(_on_host(part), str(out / file_name), metadata={"format": "pt"})
        share_weights_file(out / file_name)
        weight_map.update(dict.fromkeys(part, file_name))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


def make_model(
    arch: str,
    size: str,
    out: str | Path,
    seed: int = 0,
    dtype: str = "float32",
    num_shards: int = 1,
    device: str = "cpu",
) -> Path:
    """Write the checkpoint; `device` is where the random weights are drawn."""
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {tuple(SIZES)}, got {size!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shape = SIZES[size]
    tokenizer = train_tokenizer(arch)
    vocab_size = shape.vocab_size or tokenizer.get_vocab_size()
    tokenizer.save(str(out / "tokenizer.json"))
    config = _hf_config(arch, shape, vocab_size, tokenizer, dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    eos_ids = [tokenizer.token_to_id(IM_END), tokenizer.token_to_id(EOS)]
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": eos_ids, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS if arch == "llama" else None,
        "eos_token": IM_END,
        "pad_token": EOS,
        "model_max_length": shape.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    weights = random_weights(arch, shape, vocab_size, seed, getattr(torch, dtype), device)
    _save_shards(weights, out, num_shards)
    (out / "README.md").write_text(
        f"# kvferry {size} {arch} test checkpoint\n\nRandom weights (seed {seed}): its output is random text.\n"
    )
    return out
