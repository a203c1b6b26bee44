"""The inference engine shared by prefill and decode nodes: `from kvferry.engine import LLM, SamplingParams`.

The names load on first use (PEP 562), so that importing a light submodule (the CLI's model shapes,
say) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "AsyncLLMEngine": "kvferry.engine.async_engine",
    "EngineDeadError": "kvferry.engine.async_engine",
    "EngineArgs": "kvferry.engine.engine_args",
    "LLM": "kvferry.engine.llm",
    "LLMEngine": "kvferry.engine.llm_engine",
    "UnsupportedModelError": "kvferry.engine.model_config",
    "CompletionOutput": "kvferry.engine.outputs",
    "RequestOutput": "kvferry.engine.outputs",
    "SamplingParams": "kvferry.engine.sampling_params",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'kvferry.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
