"""Structured outputs: a sequence's tokens held to a grammar (a JSON schema, any JSON object, a regex, one
of a list of strings) by a token mask in the sampler, from xgrammar (chosen by measurement:
benchmarks/grammar_libraries.py, docs/benchmarks.md).

Each engine compiles a grammar once (xgrammar caches compiled grammars by their text) and gives each
sequence a matcher: before a step the matcher fills the sequence's row of a bitmask of allowed tokens, the
sampler sets every other logit to -inf, and the sampled token moves the matcher on. The grammar allows an
end token only where the output is complete; a matcher that accepted one has terminated, and so has its
sequence. xgrammar (and the transformers it brings) loads on the first request that has a grammar.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from kvferry.engine.sampling_params import Grammar

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from kvferry.engine.sequence import Sequence


class GrammarCompiler:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, end_token_ids: Iterable[int]) -> None:
        """`vocab_size`: the logits' width (the model's vocabulary, which may pad the tokenizer's)."""
        import xgrammar
        from transformers import PreTrainedTokenizerFast

        self._xgrammar = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tokenizer),
                                                       vocab_size=vocab_size, stop_token_ids=sorted(end_token_ids))
        # One thread: the engine's own step runs beside it, and on few cores xgrammar's threads only wait.
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1)

    def matcher(self, grammar: Grammar) -> Any:
        """A new sequence's matcher (an xgrammar GrammarMatcher). Raises ValueError naming what does not compile."""
        return self._xgrammar.GrammarMatcher(self._compile(grammar))

    def _compile(self, grammar: Grammar) -> Any:
        compiler = self._compiler
        try:
            if grammar.kind in ("json_schema", "json_object"):
                # json_object is OpenAI's "any JSON object" (xgrammar's built-in JSON grammar takes any value).
                # Compact JSON (no free whitespace): a small model offered free whitespace can spend its whole
                # budget on newlines.
                schema = grammar.spec if grammar.kind == "json_schema" else '{"type": "object"}'
                return compiler.compile_json_schema(schema, any_whitespace=False, strict_mode=True)
            if grammar.kind == "regex":
                return compiler.compile_regex(grammar.spec)
            choices = " | ".join(json.dumps(choice) for choice in grammar.choices())
            return compiler.compile_grammar(f"root ::= {choices}")
        except (RuntimeError, ValueError) as exc:  # xgrammar raises both for what it cannot compile
            raise ValueError(f"the {grammar.kind} grammar does not compile: {exc}") from None


def mask_disallowed(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """Set to -inf, in place, every logit a row's grammar does not allow next (rows without one untouched)."""
    import xgrammar

    rows = [row for row, seq in enumerate(seqs) if seq.grammar is not None]
    bitmask = xgrammar.allocate_token_bitmask(len(rows), logits.shape[1])
    for index, row in enumerate(rows):
        seqs[row].grammar.fill_next_token_bitmask(bitmask, index)
    masked = logits[rows]
    xgrammar.apply_token_bitmask_inplace(masked, bitmask.to(logits.device, non_blocking=True))
    logits[rows] = masked
