"""What generate() returns and the async engine streams, shaped like vLLM's RequestOutput."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvferry.kvcache.allocator import AllocatorStats


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort" or None while running
    stop_reason: str | int | None = None  # the stop string or stop token that ended it
    # For each sampled token: {token_id: logprob} holding the sampled token and the top-k alternatives.
    logprobs: list[dict[int, float]] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    num_cached_tokens: int = 0
    # Prefill side of a disaggregated request: the prompt's blocks, held until release_kv().
    kv_block_ids: list[int] | None = None
    # Seconds the request waited before its first scheduled step (None until then).
    queue_seconds: float | None = None

    @property
    def finished(self) -> bool:
        return all(output.finished for output in self.outputs)


@dataclass(frozen=True)
class EngineOccupancy:
    """What an engine holds at one moment: what nodes report as load and check for leaks."""

    running: int
    waiting: int
    reserved: int  # decode side: reservations whose KV has not arrived or not been claimed
    held_kv: int  # prefill side: finished prompts whose blocks are still travelling
    blocks: AllocatorStats
    preemptions: int
