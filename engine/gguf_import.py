"""GGUF import: a llama.cpp GGUF file turned into the Hugging Face folder the engine loads.

Written: config.json (from the `{arch}.*` metadata), model*.safetensors (every tensor dequantized by
`gguf.quants.dequantize` to float32, renamed to Hugging Face's names, Q and K rows put back in the order
llama.cpp's converter changed for its rope), tokenizer.json and tokenizer_config.json (engine/gguf_tokenizer.py),
chat_template.jinja, generation_config.json.

float32 because dequantization is exact in it (a Q4_1 weight is d * q + m with float16 d and m, and
their product does not fit float16 or bfloat16), so the folder holds what transformers' own GGUF loading
yields; the engine casts to the serving dtype as it loads, and config.json's torch_dtype names the dtype
a GPU serves the file in by default. The folder is written beside its destination and renamed into place
at the end: an interrupted or failed import leaves nothing half-written behind.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kvferry.engine.gguf_tokenizer import GGUFTokenizerError, build_tokenizer
from kvferry.engine.model_config import ModelConfig, UnsupportedModelError

# general.architecture -> config.json's architecture; the engine's families (engine/model_config.py).
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# GGUF tensor names -> Hugging Face names; `{}` is the layer index.
_GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                   "output.weight": "lm_head.weight"}
_BLOCK_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# llama.cpp's file types whose weights are all float32 or float16; anything else is served in bfloat16.
_FILE_TYPE_DTYPES = {0: "float32", 1: "float16"}
SHARD_BYTES = 2 << 30


class GGUFImportError(ValueError):
    """The file cannot be imported; the message (one line) says why."""


Progress = Callable[[int, int], None]  # (tensors done, tensors in all)


def _quiet(done: int, total: int) -> None:
    pass


def read_gguf(path: Path) -> tuple[dict[str, Any], list[Any]]:
    """The file's metadata as Python values, and its tensors (gguf ReaderTensors, data memory-mapped)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        metadata = {name: field.contents() for name, field in reader.fields.items()}
        tensors = list(reader.tensors)
    except Exception as exc:  # noqa: BLE001 - the reader raises anything on a damaged file (ValueError, IndexError...)
        raise GGUFImportError(f"not a readable GGUF file, truncated or corrupt ({type(exc).__name__}: {exc})") from None
    for tensor in tensors:
        if tensor.data.nbytes != tensor.n_bytes:  # the reader maps what is there: a cut file gives short tensors
            raise GGUFImportError(f"truncated: tensor {tensor.name} has {tensor.data.nbytes} of its {tensor.n_bytes} bytes")
    return metadata, tensors


def hf_config(metadata: dict[str, Any], tensor_names: set[str], vocab_size: int) -> dict[str, Any]:
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFImportError(f"GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}")

    def key(name: str, default: Any = None) -> Any:
        value = metadata.get(f"{arch}.{name}", default)
        if value is None:
            raise GGUFImportError(f"the GGUF file lacks {arch}.{name}")
        return value

    if "rope_freqs.weight" in tensor_names:
        raise GGUFImportError("the GGUF file scales its rope with a rope_freqs tensor (Llama 3.1 style): not supported yet")
    hidden, heads = key("embedding_length"), key("attention.head_count")
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": key("attention.key_length", metadata.get(f"{arch}.rope.dimension_count", hidden // heads)),
        "hidden_act": "silu",
        "max_position_embeddings": key("context_length"),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "torch_dtype": _FILE_TYPE_DTYPES.get(metadata.get("general.file_type"), "bfloat16"),
    }
    scaling = metadata.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    elif scaling != "none":
        raise GGUFImportError(f"GGUF rope scaling {scaling!r} is not supported; supported: none, linear")
    if arch in ("qwen2", "qwen3"):
        config.update(use_sliding_window=False, sliding_window=None)
    return config


def _unpermute(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter reorders each Llama head's Q/K rows from rotate-half pairs (i, i + d/2) to
    interleaved pairs (2i, 2i + 1), the rope its kernels apply; this puts them back."""
    half = rows.shape[0] // num_heads // 2
    return rows.reshape(num_heads, half, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _hf_name(gguf_name: str, num_layers: int) -> str:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < num_layers:
        if parts[2] in _BLOCK_TENSORS:
            return f"model.layers.{parts[1]}.{_BLOCK_TENSORS[parts[2]]}"
    raise GGUFImportError(f"GGUF tensor {gguf_name!r} has no place in kvferry's model")


def _dequantized(tensor: Any) -> np.ndarray:
    from gguf.quants import dequantize

    shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists dimensions innermost first
    try:
        values = dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as exc:
        raise GGUFImportError(f"GGUF tensor {tensor.name}: {exc}") from None
    return np.ascontiguousarray(values.reshape(shape), dtype=np.float32)


def _write_weights(tensors: list[Any], config: dict[str, Any], out: Path, progress: Progress) -> None:
    # Imported here: weights.py loads torch, which resolving an already imported file does not need.
    from safetensors.numpy import save_file

    from kvferry.engine.weights import INDEX_FILE, share_weights_file

    permute = {"self_attn.q_proj": config["num_attention_heads"], "self_attn.k_proj": config["num_key_value_heads"]}
    shard: dict[str, np.ndarray] = {}
    names = [_hf_name(t.name, config["num_hidden_layers"]) for t in tensors]
    weight_map: dict[str, int] = {}
    files: list[str] = []

    def flush() -> None:
        if shard:
            files.append(f"shard-{len(files)}")
            path = out / f"{files[-1]}.safetensors"
            save_file(shard, str(path), metadata={"format": "pt"})
            share_weights_file(path)
            weight_map.update(dict.fromkeys(shard, len(files) - 1))
            shard.clear()

    size = 0
    for index, (tensor, name) in enumerate(zip(tensors, names, strict=True)):
        values = _dequantized(tensor)
        module = name.rsplit(".", 1)[0].split(".", 3)[-1]
        if config["model_type"] == "llama" and module in permute:
            values = _unpermute(values, permute[module])
        if size + values.nbytes > SHARD_BYTES:
            flush()
            size = 0
        shard[name] = values
        size += values.nbytes
        progress(index + 1, len(tensors))
    flush()
    if len(files) == 1:
        (out / f"{files[0]}.safetensors").rename(out / "model.safetensors")
        return
    final = [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
    for temporary, name in zip(files, final, strict=True):
        (out / f"{temporary}.safetensors").rename(out / name)
    total = sum(int(np.prod([int(n) for n in t.shape])) * 4 for t in tensors)
    index_file = {"metadata": {"total_size": total}, "weight_map": {n: final[i] for n, i in weight_map.items()}}
    (out / INDEX_FILE).write_text(json.dumps(index_file, indent=2))


def _write_folder(gguf_path: Path, out: Path, progress: Progress) -> None:
    metadata, tensors = read_gguf(gguf_path)
    try:
        tokenizer = build_tokenizer(metadata)
    except GGUFTokenizerError as exc:
        raise GGUFImportError(str(exc)) from None
    names = {t.name for t in tensors}
    embed = next((t for t in tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise GGUFImportError("the GGUF file has no token_embd.weight tensor")
    config = hf_config(metadata, names, vocab_size=int(embed.shape[1]))
    config.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None)
    try:
        ModelConfig.from_dict(config)  # refuse here what the engine would refuse at load time
    except UnsupportedModelError as exc:
        raise GGUFImportError(str(exc)) from None
    _write_weights(tensors, config, out, progress)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.tokenizer.save(str(out / "tokenizer.json"))
    tokenizer_config = {**tokenizer.tokenizer_config, "model_max_length": config["max_position_embeddings"]}
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    if template := metadata.get("tokenizer.chat_template"):
        (out / "chat_template.jinja").write_text(template)
    generation = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": list(tokenizer.eos_token_ids)}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    name = metadata.get("general.name") or gguf_path.stem
    (out / "README.md").write_text(f"# {name}\n\nImported by kvferry from the GGUF file {gguf_path.name}.\n")


def convert_gguf(gguf_path: str | Path, out: str | Path, progress: Progress = _quiet) -> Path:
    """Write the Hugging Face folder `out` from a GGUF file; `out` must not exist or be empty. Raises
    GGUFImportError with a one-line message; on any failure nothing is left at `out`."""
    gguf_path, out = Path(gguf_path), Path(out)
    if not gguf_path.is_file():
        raise GGUFImportError(f"{gguf_path}: no such file")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GGUFImportError(f"{out} exists and is not an empty folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    partial.chmod(0o755)  # mkdtemp's 0700 would keep the folder from other users of a shared cache
    try:
        try:
            _write_folder(gguf_path, partial, progress)
        except GGUFImportError as exc:
            raise GGUFImportError(f"{gguf_path}: {exc}") from None
        if out.exists():
            out.rmdir()
        os.rename(partial, out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return out


def stderr_progress(done: int, total: int) -> None:
    """Every tenth of the tensors, on one line rewritten in a terminal, one line each in a log."""
    if done * 10 // total == (done - 1) * 10 // total and done != total:
        return
    terminal = sys.stderr.isatty()
    end = "\n" if done == total or not terminal else ""
    print(f"{chr(13) if terminal else ''}  dequantizing: {done}/{total} tensors", end=end, file=sys.stderr, flush=True)
