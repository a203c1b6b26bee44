"""The two grammar libraries behind one matcher (fill a row of the allowed-token bitmask, accept a token,
say whether an end was accepted): xgrammar for most grammars, llguidance for JSON schemas with
length-bounded free strings.

Why two, measured (benchmarks/grammar_libraries.py and structured_throughput.py, docs/benchmarks.md): on
the 22 test schemas xgrammar fills a mask 10x faster than llguidance; but a string with maxLength or
minLength and no pattern costs xgrammar 4.9 ms per token on average (up to 48 ms, 0.02 ms without the
bound: its token cache cannot cover a counted repetition of any character), where llguidance takes 0.11 ms.
One such request at batch 64 holds up every sequence of the step, so those schemas go to llguidance. Both
libraries write the same bitmask layout (32 tokens per int32 word), so one bitmask serves a mixed batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

import torch

from kvferry.engine.sampling_params import Grammar

if TYPE_CHECKING:
    from tokenizers import Tokenizer


class GrammarMatcher(Protocol):
    def fill(self, bitmask: torch.Tensor, row: int) -> None: ...
    def accept_token(self, token: int) -> bool: ...
    def is_terminated(self) -> bool: ...


def fill_bitmask(bitmask: torch.Tensor, matchers: Sequence[GrammarMatcher]) -> None:
    """Row i of the bitmask from matchers[i]: llguidance's rows in one call, xgrammar's one by one."""
    llguidance_rows = [(matcher, row) for row, matcher in enumerate(matchers) if isinstance(matcher, _LLGuidanceMatcher)]
    if llguidance_rows:
        _LLGuidanceMatcher.fill_rows(bitmask, llguidance_rows)
    for row, matcher in enumerate(matchers):
        if not isinstance(matcher, _LLGuidanceMatcher):
            matcher.fill(bitmask, row)


class XGrammar:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, end_token_ids: Iterable[int]) -> None:
        import xgrammar
        from transformers import PreTrainedTokenizerFast

        self._xgrammar = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tokenizer),
                                                       vocab_size=vocab_size, stop_token_ids=sorted(end_token_ids))
        # One thread: the engine's own step runs beside it, and on few cores xgrammar's threads only wait.
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1)

    def matcher(self, grammar: Grammar) -> GrammarMatcher:
        return _XGrammarMatcher(self._xgrammar.GrammarMatcher(self._compile(grammar)))

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


class _XGrammarMatcher:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._inner.fill_next_token_bitmask(bitmask, row)

    def accept_token(self, token: int) -> bool:
        return self._inner.accept_token(token)

    def is_terminated(self) -> bool:
        return self._inner.is_terminated()


class LLGuidance:
    """JSON schemas only: the grammars `uses_llguidance` sends here."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, end_token_ids: Iterable[int]) -> None:
        import llguidance
        import llguidance.hf
        from transformers import PreTrainedTokenizerFast

        self._llguidance = llguidance
        self._tokenizer = llguidance.hf.from_tokenizer(PreTrainedTokenizerFast(tokenizer_object=tokenizer),
                                                       n_vocab=vocab_size, eos_token=sorted(end_token_ids))
        self._compiled: dict[str, str] = {}  # a schema's grammar, checked once (as xgrammar caches its own)

    def matcher(self, grammar: Grammar) -> GrammarMatcher:
        if grammar.kind != "json_schema":
            raise ValueError(f"llguidance serves json_schema grammars here, not {grammar.kind}")
        compiled = self._compiled.get(grammar.spec)
        if compiled is None:
            matcher_class = self._llguidance.LLMatcher
            # Compact JSON, as with xgrammar: the same outputs whichever library holds the schema.
            compiled = matcher_class.grammar_from_json_schema(
                json.dumps(_closed(json.loads(grammar.spec))),
                defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "})
            error = matcher_class.validate_grammar(compiled, self._tokenizer)
            if error:
                raise ValueError(f"the json_schema grammar does not compile: {error}")
            self._compiled[grammar.spec] = compiled
        return _LLGuidanceMatcher(self._llguidance.LLMatcher(self._tokenizer, compiled))


class _LLGuidanceMatcher:
    def __init__(self, inner: Any) -> None:
        import llguidance.torch

        self._inner, self._fill = inner, llguidance.torch.fill_next_token_bitmask

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self._fill(self._inner, bitmask, row)

    @staticmethod
    def fill_rows(bitmask: torch.Tensor, rows: list[tuple[_LLGuidanceMatcher, int]]) -> None:
        import llguidance.torch

        llguidance.torch.fill_next_token_bitmask_par(_executor(), [(m._inner, row) for m, row in rows], bitmask)

    def accept_token(self, token: int) -> bool:
        return self._inner.consume_token(token)

    def is_terminated(self) -> bool:
        return self._inner.is_stopped()


@cache
def _executor() -> Any:
    """llguidance's batch filler, on one thread. With two (torch's count, on two cores) the 64 rows filled no
    faster, and the pool's threads, spinning after each fill, slowed the model's next step by a sixth:
    decode at 64 sequences lost 9% to a schema instead of 5% (cProfile of the engine, both sides)."""
    import llguidance

    return llguidance.LLExecutor(num_threads=1)


def _closed(schema: Any) -> Any:
    """The schema with `additionalProperties: false` on every object that does not say otherwise: what
    xgrammar's strict mode does, so that a schema means the same whichever library holds it."""
    if isinstance(schema, list):
        return [_closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {}
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
            closed[key] = {name: _closed(sub) for name, sub in value.items()}  # names -> schemas
        else:
            closed[key] = _closed(value)
    if "properties" in closed and "additionalProperties" not in closed:
        closed["additionalProperties"] = False
    return closed


def uses_llguidance(grammar: Grammar) -> bool:
    """A JSON schema with a string whose length is bounded and whose characters are not (no pattern, enum,
    const or format): the grammars xgrammar's masks are slow for (module docstring)."""
    return grammar.kind == "json_schema" and _has_bounded_free_string(json.loads(grammar.spec))


def _has_bounded_free_string(node: Any) -> bool:
    if isinstance(node, list):
        return any(_has_bounded_free_string(item) for item in node)
    if not isinstance(node, dict):
        return False
    if (node.get("type") == "string" and ("maxLength" in node or node.get("minLength", 0) > 0)
            and not any(key in node for key in ("pattern", "enum", "const", "format"))):
        return True
    return any(_has_bounded_free_string(value) for value in node.values())
