"""One sequence being generated: its tokens, its place in the KV pool, and its text so far."""

from __future__ import annotations

import enum
import itertools
from typing import Any

import torch

from kvferry.engine.detokenizer import IncrementalDetokenizer
from kvferry.engine.sampler import skip_seeded_draws
from kvferry.engine.sampling_params import SamplingParams

_sequence_ids = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(
        self,
        request_id: str,
        index: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        detokenizer: IncrementalDetokenizer,
        generator: torch.Generator | None,
        end_token_ids: frozenset[int] = frozenset(),
        grammar: Any = None,
    ) -> None:
        self.seq_id = next(_sequence_ids)
        self.request_id = request_id
        self.index = index  # which of the request's n completions this is
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.detokenizer = detokenizer
        self.generator = generator
        self.end_token_ids = end_token_ids  # the tokens that end it: its stop_token_ids, and EOS unless ignored
        self.grammar = grammar  # its structured output's matcher (engine/grammar.py), or None
        self.status = SequenceStatus.WAITING
        self.block_ids: list[int] = []
        self.block_hashes: list[int] = []  # hashes of the leading full blocks, grown as tokens are computed
        self.num_computed_tokens = 0
        self.num_registered_blocks = 0  # leading blocks already offered to the prefix cache
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at admission
        self.logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        # A completion resumed here after its first node died: the outputs that node sent, and their text,
        # are this sequence's first outputs but are not reported again (the client has them).
        self.num_resumed_tokens = 0
        self.resumed_text_chars = 0

    def resume(self, output_token_ids: list[int], vocab_size: int) -> None:
        """Continue a completion whose first outputs another node sent: they are computed again with the
        prompt (penalties, max_tokens and stop strings count them), the detokenizer reads them so the text
        goes on exactly where the client's ends, and a seeded generator skips the draws they took."""
        if self.num_output_tokens or self.params.n != 1:
            raise ValueError("only a new sequence of a request with n == 1 can resume")
        if len(output_token_ids) >= self.params.max_tokens:
            raise ValueError(f"{len(output_token_ids)} resumed tokens leave none of max_tokens={self.params.max_tokens}")
        self.token_ids += output_token_ids
        for token_id in output_token_ids:
            self.detokenizer.append(token_id)
            if self.grammar is not None:
                self.grammar.accept_token(token_id)
        self.num_resumed_tokens = len(output_token_ids)
        self.resumed_text_chars = len(self.detokenizer.visible_text(finished=False))
        if self.generator is not None and not self.params.greedy:
            skip_seeded_draws(self.generator, vocab_size, len(output_token_ids))

    @property
    def may_end(self) -> bool:
        """It has its min_tokens outputs: an end token may be sampled, stop strings are looked for."""
        return self.num_output_tokens >= self.params.min_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def new_output_token_ids(self) -> list[int]:
        """The outputs made here (after any resumed ones)."""
        return self.token_ids[self.num_prompt_tokens + self.num_resumed_tokens :]

    def new_text(self) -> str:
        """The text that may be shown so far, after any resumed tokens' text."""
        return self.detokenizer.visible_text(self.is_finished)[self.resumed_text_chars :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def reset_for_recompute(self) -> None:
        """After preemption: the KV is gone, so every token, generated ones too, is computed again."""
        self.block_ids = []
        self.num_computed_tokens = 0
        self.num_registered_blocks = 0
        self.status = SequenceStatus.WAITING
