"""The nodes' internal HTTP API, version 1: the messages the router and the nodes exchange.

Documented in docs/internals.md. Every body is validated here, so a malformed call gets a 422 before
it reaches an engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from kvferry.engine import SamplingParams

API_PREFIX = "/internal/v1"
# How long a node keeps an idle connection open, and how long its callers (the router) reuse one: far apart.
# A caller's HTTP client may take a pooled connection back without asking the socket whether the node closed
# it; it learns of a close only once its event loop has read the FIN. With uvicorn's 5 s against the router's
# 4, one second of lag on a loaded router's loop made requests fail on connections the node had just closed
# (tests/e2e/test_keepalive.py).
NODE_KEEPALIVE_SECONDS = 60
CALLER_KEEPALIVE_SECONDS = 4.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GrammarSpec(_Strict):
    """A structured output's grammar (kvferry.engine.sampling_params.Grammar, same fields)."""

    kind: Literal["json_schema", "json_object", "regex", "choice"]
    spec: str = ""


class SamplingSpec(_Strict):
    """The subset of SamplingParams that travels between processes (same names, same rules)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    max_tokens: int = 16
    min_tokens: int = 0
    grammar: GrammarSpec | None = None
    logprobs: int | None = None

    def to_params(self, **overrides: Any) -> SamplingParams:
        # The engine (and torch) loads only when parameters are built.
        from kvferry.engine import SamplingParams
        from kvferry.engine.sampling_params import Grammar

        fields = self.model_dump()
        fields["grammar"] = Grammar(**fields["grammar"]) if fields["grammar"] else None
        return SamplingParams(**{**fields, **overrides})


class PromptRequest(_Strict):
    """A prompt for a node: D's /decode (KV from a prefill node) and /generate (prefilled on D)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingSpec
    # A stream migrated from a decode node that died: the output tokens its client already has. The node
    # continues after them and streams only what follows (a prefill node computes them with the prompt).
    resumed_token_ids: list[int] = Field(default_factory=list)


class ReservedKV(_Strict):
    """The first line of D's /decode stream: where the prefill node writes the prompt's KV."""

    handle: dict[str, Any]  # a transfer.kv_connector.DestinationHandle as JSON
    cached_blocks: int


class PrefillRequest(PromptRequest):
    handle: dict[str, Any]


class PrefillResponse(_Strict):
    kv_bytes: int
    computed_tokens: int  # prompt tokens computed (the rest hit the prefill node's prefix cache)
    queue_ms: float  # waiting for the first step
    prefill_ms: float  # computing, after the queue
    transfer_ms: float


class StreamChunk(_Strict):
    """One NDJSON line of a decode stream: what is new since the previous line."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    logprobs: list[dict[int, float]] | None = None
    error: str | None = None
    # On the first line of a /decode stream whose KV did not come: why D prefilled the prompt itself.
    local_prefill: str | None = None
    # On the first line: the prompt tokens this node did not compute (its prefix cache held their KV). A
    # /decode stream's KV came from the prefill node, whose own count the router puts in its place.
    cached_tokens: int | None = None
    # On the first line: seconds from when this node could begin (its KV arrived; a /generate call came) to
    # this line, its first step's part of the time to first token (the router's TTFT phases).
    first_step_seconds: float | None = None
