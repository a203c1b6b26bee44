"""Structured outputs: a sequence's tokens held to a grammar (a JSON schema, any JSON object, a regex, one
of a list of strings) by a token mask in the sampler, from xgrammar, or llguidance for the JSON schemas it
is much faster on (engine/grammar_backends.py says which and why, with the measurements).

Each engine compiles a grammar once (both libraries keep what they compiled) and gives each sequence a
matcher: before a step every constrained row of one bitmask of allowed tokens is filled by its matcher,
the sampler sets every other logit to -inf, and the sampled token moves the matcher on. The grammar allows
an end token only where the output is complete; a matcher that accepted one has terminated, and so has its
sequence. A library (and the transformers it brings) loads on the first request that needs it.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache, cached_property
from typing import TYPE_CHECKING

import torch

from kvferry.engine.grammar_backends import (
    GrammarMatcher,
    LLGuidance,
    XGrammar,
    fill_bitmask,
    uses_llguidance,
)
from kvferry.engine.sampling_params import Grammar

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from kvferry.engine.sequence import Sequence


class GrammarCompiler:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, end_token_ids: Iterable[int]) -> None:
        """`vocab_size`: the logits' width (the model's vocabulary, which may pad the tokenizer's)."""
        self._tokenizer, self._vocab_size, self._end_token_ids = tokenizer, vocab_size, tuple(end_token_ids)

    def matcher(self, grammar: Grammar) -> GrammarMatcher:
        """A new sequence's matcher. Raises ValueError naming what does not compile."""
        library = self._llguidance if uses_llguidance(grammar) else self._xgrammar
        return library.matcher(grammar)

    @cached_property
    def _xgrammar(self) -> XGrammar:
        return XGrammar(self._tokenizer, self._vocab_size, self._end_token_ids)

    @cached_property
    def _llguidance(self) -> LLGuidance:
        return LLGuidance(self._tokenizer, self._vocab_size, self._end_token_ids)


def mask_disallowed(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """Set to -inf, in place, every logit a row's grammar does not allow next (rows without one untouched)."""
    rows = [row for row, seq in enumerate(seqs) if seq.grammar is not None]
    bitmask = torch.full((len(rows), (logits.shape[1] + 31) // 32), -1, dtype=torch.int32)
    fill_bitmask(bitmask, [seqs[row].grammar for row in rows])
    # Added as a bias of 0 or -inf, looked up 8 tokens (one byte of the mask) at a time: on two cores a
    # 64 x 49,152 batch took 2.3 ms so, where xgrammar's apply_token_bitmask_inplace took 11-20 ms and
    # torch's masked_fill_ 15 ms (benchmarks/structured_throughput.py found it; docs/benchmarks.md).
    mask_bytes = bitmask.to(logits.device, non_blocking=True).view(torch.uint8).long()
    bias = torch.nn.functional.embedding(mask_bytes, _byte_bias(logits.device)).view(len(rows), -1)
    logits.index_add_(0, torch.tensor(rows, device=logits.device), bias[:, : logits.shape[1]])


@cache
def _byte_bias(device: torch.device) -> torch.Tensor:
    """[256, 8]: for each byte of a bitmask, the bias of its 8 tokens (bit i, little-endian: 0 allowed, -inf not)."""
    bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
    return torch.zeros(256, 8).masked_fill_(bits == 0, float("-inf")).to(device)
