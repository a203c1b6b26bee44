"""The offline API, shaped like vLLM's: `LLM(model_dir, dtype=...).generate(prompts, sampling_params)`."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvferry.engine.engine_args import EngineArgs
from kvferry.engine.llm_engine import LLMEngine, PromptInput
from kvferry.engine.outputs import RequestOutput
from kvferry.engine.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str | Path, **engine_args: Any) -> None:
        self.engine = LLMEngine(model, EngineArgs(**engine_args))
        self._ids = itertools.count()

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        show_progress: bool = False,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str | dict):
            prompts = [prompts]
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(sampling_params)} sampling_params")
        order = []
        for prompt, params in zip(prompts, sampling_params, strict=True):
            request_id = str(next(self._ids))
            self.engine.add_request(request_id, prompt, params)
            order.append(request_id)
        finished: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished_requests():
            for output in self.engine.step():
                if output.finished:
                    finished[output.request_id] = output
                    if show_progress:
                        print(f"\r{len(finished)}/{len(order)} requests done", end="", file=sys.stderr, flush=True)
        if show_progress:
            print(file=sys.stderr)
        return [finished[request_id] for request_id in order]
