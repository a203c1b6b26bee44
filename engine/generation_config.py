"""Defaults a checkpoint ships in generation_config.json; for now the tokens that end generation."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvferry.engine.model_config import ModelConfig
from kvferry.engine.tokenizer import ModelTokenizer


@dataclass(frozen=True)
class GenerationDefaults:
    eos_token_ids: frozenset[int]

    @classmethod
    def from_dir(cls, model_dir: Path, config: ModelConfig, tokenizer: ModelTokenizer) -> GenerationDefaults:
        eos: set[int] = set(config.eos_token_ids)
        path = model_dir / "generation_config.json"
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            eos.update(value if isinstance(value, list) else [] if value is None else [value])
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        return cls(frozenset(eos))
