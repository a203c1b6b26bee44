"""A request's token counts, as chunks arrive: what `usage` says in every API shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TokenUsage:
    prompt_tokens: int  # every prompt's, once
    completion_tokens: int  # every choice's, the best_of ones left out too (each was computed)
    cached_tokens: int  # prompt tokens no node computed for this request: their KV was in a prefix cache

    def chat(self) -> dict[str, Any]:
        """Completions' and chat's `usage`."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def responses(self, reasoning_tokens: int) -> dict[str, Any]:
        """The Responses API's `usage`."""
        return {"input_tokens": self.prompt_tokens, "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                "total_tokens": self.prompt_tokens + self.completion_tokens}


class UsageTally:
    """Counts a request's node chunks. A choice's first line says how much of its prompt was cached (a migrated
    stream's next node says it again: the first counts); the choices of one prompt share it, so each prompt
    counts its best choice's."""

    def __init__(self, prompt_tokens: int, num_choices: int, choices_per_prompt: int) -> None:
        self.prompt_tokens, self.per_prompt = prompt_tokens, choices_per_prompt
        self.completion_tokens = 0
        self.cached: list[int | None] = [None] * num_choices

    def add(self, index: int, chunks: list[dict[str, Any]]) -> None:
        for chunk in chunks:
            self.completion_tokens += len(chunk["token_ids"])
        if self.cached[index] is None and chunks and chunks[0].get("cached_tokens") is not None:
            self.cached[index] = chunks[0]["cached_tokens"]

    def usage(self) -> TokenUsage:
        per_prompt = [self.cached[start:start + self.per_prompt] for start in range(0, len(self.cached), self.per_prompt)]
        cached = sum(max((count or 0 for count in group), default=0) for group in per_prompt)
        return TokenUsage(self.prompt_tokens, self.completion_tokens, cached)
