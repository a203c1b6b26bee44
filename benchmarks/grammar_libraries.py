"""Which grammar library masks the sampler for structured outputs: xgrammar against llguidance, side by side
on the same tokenizer (the default model's, SmolLM2-135M-Instruct: 49,152 tokens) and the same schemas
(tests/support/structured_schemas.py: 22 Pydantic models, each with a valid instance).

Per library:
- coverage: the schema compiles, its instance's tokens are all accepted one by one, and the grammar then
  accepts an end (the instance is complete); a wrong start (`[`: every schema is an object) is refused;
- compile time of each schema, cold (no cache; the tokenizer's preprocessing done once beforehand);
- mask time per token at batch 1: filling the allowed-token bitmask before each of the instance's tokens;
- mask time per step at batch 64: 64 sequences (the schemas in turn), each at its own place in its instance,
  the whole batch's bitmask filled per step with the library's batch call on every core.
Measured on the CPU (the mask is filled on the host in both; applying it to the logits is one torch op, the
same for both, and left out). Ratios: llguidance's times over xgrammar's, at the same thread count.

    .venv/bin/python -m benchmarks.grammar_libraries          # -> benchmarks/results/grammar_libraries.json
    .venv/bin/python -m benchmarks.grammar_libraries --quick  # 3 schemas, a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.results import new_result, params_of, write_result
from benchmarks.harness.table import print_table
from tests.support.structured_schemas import SCHEMAS

BATCH = 64


class Matcher(Protocol):
    def fill(self, bitmask: torch.Tensor, row: int) -> None: ...
    def accept(self, token: int) -> bool: ...
    def accepts_end(self) -> bool: ...


@dataclass
class Library:
    name: str
    version: str
    prepare_seconds: float  # the tokenizer's preprocessing, once per model
    compile: Callable[[str], Any]  # a JSON schema -> a compiled grammar
    matcher: Callable[[Any], Matcher]
    fill_batch: Callable[[list[Matcher], torch.Tensor], None]
    allocate: Callable[[int], torch.Tensor]


def _xgrammar(tokenizer: Any, vocab: int, threads: int) -> Library:
    import xgrammar as xgr

    started = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    prepared = time.perf_counter() - started
    end_tokens = {tokenizer.eos_token_id}
    batch = xgr.BatchGrammarMatcher(max_threads=threads)

    class XMatcher:
        def __init__(self, compiled: Any) -> None:
            self.inner = xgr.GrammarMatcher(compiled, override_stop_tokens=sorted(end_tokens))

        def fill(self, bitmask: torch.Tensor, row: int) -> None:
            self.inner.fill_next_token_bitmask(bitmask, row)

        def accept(self, token: int) -> bool:
            return self.inner.accept_token(token)

        def accepts_end(self) -> bool:
            return self.inner.accept_token(tokenizer.eos_token_id)

    def compile_schema(schema: str) -> Any:
        # A compiler without a cache: each schema compiled cold, as a new request's would be.
        return xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False).compile_json_schema(schema)

    def fill_batch(matchers: list[Matcher], bitmask: torch.Tensor) -> None:
        batch.batch_fill_next_token_bitmask([m.inner for m in matchers], bitmask)  # type: ignore[attr-defined]

    return Library(f"xgrammar x{threads}", _version("xgrammar"), prepared, compile_schema, XMatcher, fill_batch,
                   lambda rows: xgr.allocate_token_bitmask(rows, vocab))


def _llguidance(tokenizer: Any, vocab: int, threads: int) -> Library:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    started = time.perf_counter()
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
    prepared = time.perf_counter() - started
    executor = llguidance.LLExecutor(threads)

    class LMatcher:
        def __init__(self, grammar: str) -> None:
            self.inner = llguidance.LLMatcher(ll_tokenizer, grammar)
            if self.inner.is_error():
                raise ValueError(self.inner.get_error())

        def fill(self, bitmask: torch.Tensor, row: int) -> None:
            llguidance.torch.fill_next_token_bitmask(self.inner, bitmask, row)

        def accept(self, token: int) -> bool:
            return self.inner.consume_token(token)

        def accepts_end(self) -> bool:
            return self.inner.is_accepting() and self.inner.consume_token(tokenizer.eos_token_id)

    def compile_schema(schema: str) -> Any:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": True})
        LMatcher(grammar)  # llguidance compiles lazily: the first matcher builds the parser
        return grammar

    def fill_batch(matchers: list[Matcher], bitmask: torch.Tensor) -> None:
        pairs = [(m.inner, row) for row, m in enumerate(matchers)]  # type: ignore[attr-defined]
        llguidance.torch.fill_next_token_bitmask_par(executor, pairs, bitmask)

    return Library(f"llguidance x{threads}", _version("llguidance"), prepared, compile_schema, LMatcher, fill_batch,
                   lambda rows: llguidance.torch.allocate_token_bitmask(rows, vocab))


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _coverage(library: Library, name: str, compiled: Any, tokens: list[int], wrong_start: int) -> str | None:
    """None when the instance is accepted to its end and the wrong token refused; else what failed."""
    matcher = library.matcher(compiled)
    for position, token in enumerate(tokens):
        if not matcher.accept(token):
            return f"{name}: token {position} of the valid instance refused"
    if not matcher.accepts_end():
        return f"{name}: no end allowed after the complete instance"
    return f"{name}: a wrong start was accepted" if library.matcher(compiled).accept(wrong_start) else None


def _batch1_mask_seconds(library: Library, compiled: Any, tokens: list[int]) -> list[float]:
    matcher, bitmask, times = library.matcher(compiled), library.allocate(1), []
    for token in tokens:
        started = time.perf_counter()
        matcher.fill(bitmask, 0)
        times.append(time.perf_counter() - started)
        _accept(matcher, token)
    return times


def _batch_step_seconds(library: Library, grammars: list[tuple[Any, list[int]]], steps: int) -> list[float]:
    """A batch of BATCH sequences, each at its own place in its instance (a few tokens apart) and starting over
    when it ends: per step, the batch fill."""
    bitmask = library.allocate(BATCH)
    rows = []
    for i in range(BATCH):
        compiled, tokens = grammars[i % len(grammars)]
        matcher, position = library.matcher(compiled), i % min(7, len(tokens))
        for token in tokens[:position]:
            _accept(matcher, token)
        rows.append((matcher, compiled, tokens, position))
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        library.fill_batch([matcher for matcher, _, _, _ in rows], bitmask)
        times.append(time.perf_counter() - started)
        for row, (matcher, compiled, tokens, position) in enumerate(rows):
            _accept(matcher, tokens[position])
            rows[row] = ((matcher, compiled, tokens, position + 1) if position + 1 < len(tokens)
                         else (library.matcher(compiled), compiled, tokens, 0))
    return times


def _accept(matcher: Matcher, token: int) -> None:
    if not matcher.accept(token):  # a refused token leaves the state where it was: the timings would be off
        raise AssertionError(f"token {token} of a valid instance refused")


def measure(library: Library, tokenizer: Any, schemas: dict[str, tuple[type, str]], steps: int) -> dict[str, Any]:
    compile_seconds, mask_seconds, failures, grammars = [], [], [], []
    for name, (model, instance) in schemas.items():
        schema = json.dumps(model.model_json_schema())
        started = time.perf_counter()
        try:
            compiled = library.compile(schema)
        except Exception as exc:  # noqa: BLE001 - a schema the library cannot compile is a coverage gap
            failures.append(f"{name}: does not compile: {exc}")
            continue
        compile_seconds.append(time.perf_counter() - started)
        tokens = tokenizer.encode(instance, add_special_tokens=False)
        problem = _coverage(library, name, compiled, tokens, tokenizer.convert_tokens_to_ids("["))
        if problem is not None:
            failures.append(problem)
            continue
        grammars.append((compiled, tokens))
        mask_seconds += _batch1_mask_seconds(library, compiled, tokens)
    batch_seconds = _batch_step_seconds(library, grammars, steps) if grammars else [float("nan")]
    return {
        "variant": library.name, "version": library.version, "schemas": len(schemas),
        "covered": len(schemas) - len(failures), "prepare_s": round(library.prepare_seconds, 3),
        "compile_ms_p50": round(1e3 * statistics.median(compile_seconds), 2) if compile_seconds else None,
        "compile_ms_max": round(1e3 * max(compile_seconds), 2) if compile_seconds else None,
        "mask_us_b1_p50": round(1e6 * statistics.median(mask_seconds), 1) if mask_seconds else None,
        "mask_us_b1_p99": round(1e6 * _percentile(mask_seconds, 0.99), 1) if mask_seconds else None,
        "mask_ms_b64_p50": round(1e3 * statistics.median(batch_seconds), 3),
        "mask_ms_b64_p99": round(1e3 * _percentile(batch_seconds, 0.99), 3),
        "failures": failures,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, "grammar_libraries")
    parser.add_argument("--model", default=None, help="tokenizer folder (default: the default model, imported once)")
    parser.add_argument("--steps", type=int, default=200, help="batch-64 steps timed")
    parser.add_argument("--threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}),
                        help="the batch calls' (and xgrammar's compiler's) threads, a row each (default: 1 and every core)")
    parser.add_argument("--quick", action="store_true", help="3 schemas, 20 steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = 20
    return args


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoTokenizer

    from kvferry.engine.model_source import default_model

    args = parse_args(argv)
    torch.set_num_threads(1)
    model = args.model or str(default_model())
    tokenizer = AutoTokenizer.from_pretrained(model)
    vocab = len(tokenizer)
    schemas = dict(list(SCHEMAS.items())[:3]) if args.quick else SCHEMAS
    rows = [measure(build(tokenizer, vocab, threads), tokenizer, schemas, args.steps)
            for threads in args.threads for build in (_xgrammar, _llguidance)]
    ratios = {}
    for base, other in zip(rows[::2], rows[1::2], strict=True):
        ratios[f"{other['variant']} / {base['variant']}"] = {
            key: round(other[key] / base[key], 2) for key in ("compile_ms_p50", "mask_us_b1_p50", "mask_ms_b64_p50")
            if base[key] and other[key]}
    result = new_result(
        "grammar_libraries", {**params_of(args), "model": model, "vocab": vocab}, rows, baseline=rows[0]["variant"],
        summary={"ratios": ratios},
        notes=["times on the host CPU; the batch-64 step fills all 64 rows' bitmasks with the library's parallel call"],
    )
    print_table(rows, ["variant", "covered", "schemas", "prepare_s", "compile_ms_p50", "compile_ms_max", "mask_us_b1_p50",
                       "mask_us_b1_p99", "mask_ms_b64_p50", "mask_ms_b64_p99"])
    for row in rows:
        for failure in row["failures"]:
            print(f"{row['variant']}: {failure}")
    for pair, values in ratios.items():
        print(f"{pair}: {values}")
    print(f"result: {write_result(result, output_dir(args))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
