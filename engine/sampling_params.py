"""Per-request sampling settings, shaped like vLLM's SamplingParams; invalid values name the parameter."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

GRAMMAR_KINDS = ("json_schema", "json_object", "regex", "choice")


@dataclass(frozen=True)
class Grammar:
    """What a structured output must match (engine/grammar.py): `json_schema` (spec: the schema as JSON text),
    `json_object` (any JSON object; no spec), `regex` (spec: the pattern) or `choice` (spec: a JSON list of
    the strings allowed)."""

    kind: Literal["json_schema", "json_object", "regex", "choice"]
    spec: str = ""

    def choices(self) -> list[str]:
        values = json.loads(self.spec)
        if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
            raise ValueError("a choice grammar's spec is a JSON list of one or more strings")
        return values

    def check(self) -> None:
        """What can be told without compiling: the kind, and a spec of the right shape. Raises ValueError."""
        if self.kind not in GRAMMAR_KINDS:
            raise ValueError(f"grammar kind must be one of {', '.join(GRAMMAR_KINDS)}, got {self.kind!r}")
        try:
            if self.kind == "choice":
                self.choices()
            elif self.kind == "json_schema" and not isinstance(json.loads(self.spec), dict):
                raise ValueError("a JSON schema is a JSON object")
        except json.JSONDecodeError as exc:
            raise ValueError(f"the {self.kind} grammar's spec is not JSON: {exc}") from None


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: all tokens
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    max_tokens: int = 16
    # Outputs before an end may come: EOS and stop_token_ids are masked out of the sampler, and stop strings
    # are not looked for, until the sequence has this many (vLLM's min_tokens).
    min_tokens: int = 0
    grammar: Grammar | None = None  # structured output: the tokens are held to it
    logprobs: int | None = None  # how many top alternatives to return beside each sampled token
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def stop_strings(self) -> list[str]:
        return self.stop  # type: ignore[return-value]  # normalized to a list in __post_init__

    @property
    def needs_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    def validate(self) -> None:
        checks = [
            ("n", self.n >= 1, "must be at least 1"),
            ("temperature", self.temperature >= 0.0, "must be >= 0"),
            ("top_p", 0.0 < self.top_p <= 1.0, "must be in (0, 1]"),
            ("top_k", self.top_k >= -1, "must be -1, 0 (disabled) or a positive count"),
            ("min_p", 0.0 <= self.min_p <= 1.0, "must be in [0, 1]"),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0, "must be in [-2, 2]"),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0, "must be in [-2, 2]"),
            ("repetition_penalty", self.repetition_penalty > 0.0, "must be > 0"),
            ("max_tokens", self.max_tokens >= 1, "must be at least 1"),
            ("min_tokens", 0 <= self.min_tokens <= self.max_tokens, f"must be in [0, max_tokens={self.max_tokens}]"),
            ("logprobs", self.logprobs is None or self.logprobs >= 0, "must be >= 0"),
            ("stop_token_ids", all(t >= 0 for t in self.stop_token_ids), "must be non-negative token ids"),
        ]
        if self.grammar is not None:
            self.grammar.check()
            # An unfinished grammar may allow nothing but an end, which min_tokens would forbid too.
            checks.append(("min_tokens", not self.min_tokens, "cannot be combined with a grammar"))
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"{name} {rule}, got {getattr(self, name)!r}")
