"""A second checkpoint of the default model for rollout tests: its weights with seeded noise added.

What a model upgrade usually is (a fine-tune, a new revision): the same architecture, tokenizer and KV
layout, other weights, so other greedy text. Nothing but the weights' fingerprint tells its KV from the
original's, which is the case a rollout must not mix (kvcache/compatibility.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from kvferry.engine.llm import LLM
from kvferry.engine.sampling_params import SamplingParams
from kvferry.engine.weights import checkpoint_files, share_weights_file

NOISE = 0.1  # of each tensor's standard deviation: enough to change most greedy continuations
SEED = 23


def noisy_copy(source: Path, target: Path) -> Path:
    """`source`'s folder at `target`, every weight plus seeded Gaussian noise; readable by the pods' user."""
    shutil.copytree(source, target)
    generator = torch.Generator().manual_seed(SEED)
    for path in checkpoint_files(target):
        tensors = load_file(str(path))
        for name, tensor in tensors.items():
            noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32) * tensor.float().std()
            tensors[name] = (tensor.float() + NOISE * noise).to(tensor.dtype)
        save_file(tensors, str(path), metadata={"format": "pt"})
        share_weights_file(path)
    for folder in (target, *(p for p in target.rglob("*") if p.is_dir())):
        folder.chmod(0o755)
    return target


def greedy_texts(model: Path, prompts: tuple[str, ...], max_tokens: int) -> dict[str, str]:
    """Each prompt's greedy completion of exactly `max_tokens` tokens, from the engine in this process."""
    llm = LLM(str(model))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return {prompt: output.outputs[0].text for prompt, output in zip(prompts, llm.generate(list(prompts), params),
                                                                      strict=True)}
