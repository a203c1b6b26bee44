"""The inference engine shared by prefill and decode nodes: `from kvferry.engine import LLM, SamplingParams`."""

from kvferry.engine.async_engine import AsyncLLMEngine, EngineDeadError
from kvferry.engine.engine_args import EngineArgs
from kvferry.engine.llm import LLM
from kvferry.engine.llm_engine import LLMEngine
from kvferry.engine.model_config import UnsupportedModelError
from kvferry.engine.outputs import CompletionOutput, RequestOutput
from kvferry.engine.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "AsyncLLMEngine",
    "CompletionOutput",
    "EngineArgs",
    "EngineDeadError",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
    "UnsupportedModelError",
]
