"""Decode throughput with a JSON-schema constraint against without: kvferry's engine at 1 and 64 requests.

One engine (by default the trained model, SmolLM2-135M-Instruct with its 49,152-token vocabulary, which
sets the mask's width; `--model small` for the random-weight llama checkpoint; float32, on the CPU), in one
process, the same prompts, greedy, EOS ignored, every request generating exactly max_tokens tokens on both sides; the
constrained side holds each request to a JSON schema (engine/grammar.py: the mask in the sampler, here
llguidance's, since the schema has a length-bounded string) whose shortest valid output is far longer than
max_tokens, so the grammar never ends one early. Concurrency
1: the requests one after the other; concurrency 64: all submitted together. The two sides alternate
round by round (ABBA); each side's median over the rounds, and the ratio of each round's pair, whose median
is the headline (a shared machine's speed drifts by more than the effect between rounds, much less within
one). Throughput counts output tokens: `tok_s` over
the whole run (prefill included), `decode_tok_s` over the steps after every request's first token (the
decode steps only). Prefix caching is off, so every run prefills alike. The grammar's one-time costs
(loading the libraries, a cold compile of the schema, which for llguidance includes preparing the
tokenizer, and a new matcher) are measured apart, and
kept out of the timed runs by a warm-up. One more constrained run per concurrency, under cProfile, says
what share of the engine's time the grammar's own calls take (the sampler's mask, the matchers' moves), a
figure that the machine's drift does not touch.

    .venv/bin/python -m benchmarks.structured_throughput          # -> benchmarks/results/structured_throughput.json
    .venv/bin/python -m benchmarks.structured_throughput --quick  # a smoke run: concurrency 1 and 8, 8 tokens
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import os
import pstats
import random
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import cached_model, environment
from benchmarks.harness.results import new_result, params_of, write_result
from benchmarks.harness.side_by_side import side_by_side, with_ratios
from benchmarks.harness.table import print_table
from kvferry.engine import LLM, SamplingParams
from kvferry.engine.grammar import GrammarCompiler
from kvferry.engine.grammar_backends import LLGuidance, XGrammar, uses_llguidance
from kvferry.engine.model_source import default_model
from kvferry.engine.sampling_params import Grammar

UNCONSTRAINED, CONSTRAINED = "unconstrained", "json_schema"
# An order's line items: at least 400 of them, so no output of a few hundred tokens can close the object.
# Bounded strings and numbers keep the output cycling through the structure (keys, quotes, commas, braces)
# rather than spending its budget inside one string.
SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 400,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "count": {"type": "integer", "minimum": 0, "maximum": 999},
                    "ok": {"type": "boolean"},
                },
                "required": ["name", "count", "ok"],
            },
        }
    },
    "required": ["items"],
}
GRAMMAR = Grammar(kind="json_schema", spec=json.dumps(SCHEMA))
_request_ids = itertools.count()
TRAINED = "trained"
# The grammar's own calls, per step: the sampler's mask (which fills every constrained row's bitmask) and
# the matchers' moves after each token. (file name ending, function name) as cProfile names them.
GRAMMAR_CALLS = {("engine/grammar.py", "mask_disallowed"), ("engine/grammar_backends.py", "accept_token"),
                 ("engine/grammar_backends.py", "is_terminated")}


def make_prompts(count: int, length: int, vocab: int, seed: int = 0) -> list[dict[str, list[int]]]:
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(vocab) for _ in range(length)]} for _ in range(count)]


def sampling_params(variant: str, max_tokens: int) -> SamplingParams:
    grammar = GRAMMAR if variant == CONSTRAINED else None
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, grammar=grammar)


def generate(llm: LLM, prompts: list[dict[str, list[int]]], params: SamplingParams) -> tuple[list[Any], float, float, float]:
    """LLM.generate's loop, also noting when every request has its first token. (outputs in prompt order,
    seconds in all, seconds after the first tokens, this process's CPU seconds after the first tokens)."""
    engine = llm.engine
    ids = [f"bench-{next(_request_ids)}" for _ in prompts]
    started = time.perf_counter()
    for request_id, prompt in zip(ids, prompts, strict=True):
        engine.add_request(request_id, prompt, params)
    first_tokens, first_cpu, pending, finished = None, 0.0, set(ids), {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            pending.discard(output.request_id)
            if output.finished:
                finished[output.request_id] = output
        if first_tokens is None and not pending:
            first_tokens, first_cpu = time.perf_counter(), time.process_time()
    ended, ended_cpu = time.perf_counter(), time.process_time()
    if first_tokens is None:
        raise AssertionError("a request produced no token")
    return [finished[request_id] for request_id in ids], ended - started, ended - first_tokens, ended_cpu - first_cpu


def run_side(llm: LLM, prompts: list[dict[str, list[int]]], variant: str, concurrency: int, max_tokens: int,
             checker: GrammarCompiler | None = None) -> dict[str, float]:
    """The prompts in groups of `concurrency` (each group submitted together, the groups one after the
    other); their outputs checked: exactly max_tokens tokens each, and on the constrained side a prefix of
    the schema's JSON that is not yet complete."""
    params = sampling_params(variant, max_tokens)
    seconds = decode_seconds = decode_cpu_seconds = 0.0
    outputs = []
    for start in range(0, len(prompts), concurrency):
        group_outputs, total, decode, decode_cpu = generate(llm, prompts[start : start + concurrency], params)
        outputs += group_outputs
        seconds += total
        decode_seconds += decode
        decode_cpu_seconds += decode_cpu
    for output in outputs:
        completion = output.outputs[0]
        if len(completion.token_ids) != max_tokens or completion.finish_reason != "length":
            raise AssertionError(f"{variant}: request {output.request_id} generated {len(completion.token_ids)} "
                                 f"tokens ({completion.finish_reason}), not {max_tokens}")
        if variant == CONSTRAINED and checker is not None:
            check_json_prefix(checker, completion.token_ids, completion.text)
    tokens = len(prompts) * max_tokens
    decode_tokens = len(prompts) * (max_tokens - 1)  # the first token of each comes with its prefill
    return {"seconds": seconds, "tok_s": tokens / seconds, "decode_tok_s": decode_tokens / decode_seconds,
            "decode_tok_cpu_s": decode_tokens / decode_cpu_seconds}


def check_json_prefix(checker: GrammarCompiler, token_ids: list[int], text: str) -> None:
    """A fresh matcher of the same schema accepts every token, and the output is still open (no end yet)."""
    matcher = checker.matcher(GRAMMAR)
    for position, token in enumerate(token_ids):
        if not matcher.accept_token(token):
            raise AssertionError(f"constrained output breaks the schema at token {position}: {text!r}")
    if matcher.is_terminated() or not text.startswith("{"):
        raise AssertionError(f"constrained output is not an open prefix of the schema's JSON: {text!r}")


def grammar_share(llm: LLM, prompts: list[dict[str, list[int]]], concurrency: int, max_tokens: int) -> dict[str, float]:
    """One constrained run under cProfile: the seconds in the grammar's calls over the seconds of the run."""
    profile = cProfile.Profile()
    profile.enable()
    run_side(llm, prompts, CONSTRAINED, concurrency, max_tokens)
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in stats.values())  # every function's own time: the whole run
    in_grammar = sum(entry[3] for (file, _, name), entry in stats.items()
                     if any(file.endswith(end) and name == function for end, function in GRAMMAR_CALLS))
    return {"grammar_s": round(in_grammar, 3), "profiled_s": round(total, 2),
            "grammar_share_pct": round(100 * in_grammar / total, 2)}


def library_mask_costs(llm: LLM, prompts: list[dict[str, list[int]]], max_tokens: int) -> dict[str, dict[str, float]]:
    """Why the schema is llguidance's (engine/grammar_backends.py): constrained outputs replayed through a
    matcher of each library, the time to fill the bitmask before each token (ms: mean, p90, max)."""
    engine = llm.engine
    args = (engine.tokenizer.tokenizer, engine.model_config.vocab_size, engine.generation_defaults.eos_token_ids)
    outputs = llm.generate(prompts[:4], sampling_params(CONSTRAINED, max_tokens))
    bitmask = torch.full((1, (args[1] + 31) // 32), -1, dtype=torch.int32)
    costs = {}
    for library in (XGrammar(*args), LLGuidance(*args)):
        seconds = []
        for output in outputs:
            matcher = library.matcher(GRAMMAR)
            for token in output.outputs[0].token_ids:
                started = time.perf_counter()
                matcher.fill(bitmask, 0)
                seconds.append(time.perf_counter() - started)
                if not matcher.accept_token(token):
                    raise AssertionError(f"{type(library).__name__} refuses a token the engine's mask allowed")
        seconds.sort()
        costs[type(library).__name__] = {"mean_ms": round(1e3 * statistics.fmean(seconds), 3),
                                         "p90_ms": round(1e3 * seconds[int(0.9 * len(seconds))], 3),
                                         "max_ms": round(1e3 * seconds[-1], 3)}
    return costs


def paired_ratios(runs: dict[str, list[dict[str, float]]], metric: str) -> list[float]:
    """Each round's constrained run over the same round's unconstrained run (they ran back to back)."""
    return [round(b[metric] / a[metric], 3) for a, b in zip(runs[UNCONSTRAINED], runs[CONSTRAINED], strict=True)]


def load_model(name: str) -> Path:
    return default_model() if name == TRAINED else cached_model("llama", name)


def grammar_costs(llm: LLM) -> tuple[dict[str, float], GrammarCompiler]:
    """What the first request with a grammar pays once per engine, and once per new schema: loading
    xgrammar (and the transformers it brings), then a cold compile, which includes building the schema's
    library's tokenizer data (GrammarCompiler builds each library on its first grammar, so tokenizer_prep_s
    is only the compiler's construction). Measured on a compiler of its own, before the engine has loaded
    any of it."""
    started = time.perf_counter()
    import transformers  # noqa: F401
    import xgrammar  # noqa: F401

    loaded = time.perf_counter()
    engine = llm.engine
    compiler = GrammarCompiler(engine.tokenizer.tokenizer, engine.model_config.vocab_size,
                               engine.generation_defaults.eos_token_ids)
    prepared = time.perf_counter()
    compiler.matcher(GRAMMAR)
    compiled = time.perf_counter()
    compiler.matcher(GRAMMAR)  # compiled already: xgrammar's cache, then a new matcher, as each request has
    matched = time.perf_counter()
    return {
        "import_s": round(loaded - started, 3),
        "tokenizer_prep_s": round(prepared - loaded, 3),
        "compile_ms": round(1e3 * (compiled - prepared), 2),
        "matcher_ms": round(1e3 * (matched - compiled), 3),
    }, compiler


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, "structured_throughput")
    parser.add_argument("--quick", action="store_true", help="concurrency 1 and 8, 8 tokens, one round")
    parser.add_argument("--model", default=TRAINED,
                        help=f"'{TRAINED}' (SmolLM2-135M-Instruct, the default model) or a make-model size (small)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens of every request, both sides")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--sequential", type=int, default=4, help="requests, one after the other, at concurrency 1")
    parser.add_argument("--rounds", type=int, default=6, help="runs of each side per concurrency (ABBA order)")
    args = parser.parse_args(argv)
    if args.quick:
        args.concurrency, args.max_tokens, args.sequential, args.rounds = [1, 8], 8, 2, 1
    if args.max_tokens < 2:
        parser.error("--max-tokens must be at least 2: the first token comes with the prefill, the rest are decode")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_at_start = os.getloadavg()
    model_dir = load_model(args.model)
    llm = LLM(model_dir, dtype="float32", max_model_len=1024, max_num_seqs=max(64, *args.concurrency),
              max_num_batched_tokens=2048, enable_prefix_caching=False)
    vocab = llm.engine.model_config.vocab_size
    costs, checker = grammar_costs(llm)
    print(f"grammar, once: {costs}", flush=True)
    rows, per_concurrency = [], {}
    for concurrency in args.concurrency:
        count = args.sequential if concurrency == 1 else concurrency
        prompts = make_prompts(count, args.prompt_len, vocab, seed=concurrency)
        for variant in (UNCONSTRAINED, CONSTRAINED):  # first calls' allocations; the engine's own compile
            run_side(llm, prompts, variant, concurrency, min(4, args.max_tokens))
        measured = side_by_side(
            {variant: partial(run_side, llm, prompts, variant, concurrency, args.max_tokens, checker)
             for variant in (UNCONSTRAINED, CONSTRAINED)},
            rounds=args.rounds,
        )
        for variant, runs in measured.items():
            rows.append({
                "variant": variant, "concurrency": concurrency, "requests": count,
                "output_tokens": count * args.max_tokens,
                "seconds_p50": round(statistics.median(r["seconds"] for r in runs), 2),
                "tok_s": round(statistics.median(r["tok_s"] for r in runs), 2),
                "decode_tok_s": round(statistics.median(r["decode_tok_s"] for r in runs), 2),
                "decode_tok_cpu_s": round(statistics.median(r["decode_tok_cpu_s"] for r in runs), 2),
                "decode_tok_s_runs": [round(r["decode_tok_s"], 2) for r in runs],
            })
        pairs = paired_ratios(measured, "decode_tok_s")
        per_concurrency[str(concurrency)] = {
            "decode_ratio_per_round": pairs,
            "decode_ratio_p50": statistics.median(pairs),
            "decode_slowdown_pct": round(100 * (1 - statistics.median(pairs)), 1),
            **grammar_share(llm, prompts, concurrency, args.max_tokens),
        }
        print_table(rows[-2:], ["variant", "concurrency", "requests", "output_tokens", "tok_s", "decode_tok_s",
                                "decode_tok_cpu_s", "decode_tok_s_runs"])
        print(f"concurrency {concurrency}: {per_concurrency[str(concurrency)]}", flush=True)
    mask_costs = library_mask_costs(llm, make_prompts(4, args.prompt_len, vocab, seed=7), args.max_tokens)
    print(f"mask fill per token, by library, on this schema: {mask_costs}")
    rows = with_ratios(rows, UNCONSTRAINED, ["tok_s", "decode_tok_s", "decode_tok_cpu_s"], group_by=["concurrency"])
    print()
    print_table(rows, ["variant", "concurrency", "tok_s", "decode_tok_s", "decode_tok_cpu_s", "tok_s_vs_baseline",
                       "decode_tok_s_vs_baseline", "decode_tok_cpu_s_vs_baseline"])
    print(f"constrained / unconstrained, per concurrency: {per_concurrency}")
    load = {"start": list(load_at_start), "end": list(os.getloadavg())}
    result = new_result(
        "structured_throughput",
        {**params_of(args), "model_dir": model_dir.name, "vocab": vocab, "schema": SCHEMA},
        rows,
        baseline=UNCONSTRAINED,
        summary={"constrained_vs_unconstrained": per_concurrency,
                 "library": "llguidance" if uses_llguidance(GRAMMAR) else "xgrammar",
                 "mask_fill_per_token_by_library": mask_costs, "grammar_once": costs, "target": "decode slowdown < 5% at 64"},
        notes=[
            "rows' ratios: the constrained side's median over the rounds against the unconstrained side's; the "
            "summary's decode_ratio_p50: the median of each round's constrained/unconstrained pair (the headline)",
            "grammar_share_pct: one more constrained run under cProfile, the time inside the sampler's mask and the "
            "matchers' accept_token/is_terminated over the whole run's",
            "decode_tok_cpu_s: decode tokens per second of this process's CPU time (all threads), which other jobs "
            "on the machine stretch less than wall time",
            "the grammar's one-time costs are outside the timed runs (a warm-up compiled the schema in the engine)",
            f"vocabulary of {vocab} tokens: the mask's per-token cost grows with it (grammar_libraries.py: 49,152)",
        ],
        environment={**environment(), "load_avg": load},
    )
    print(f"wrote {write_result(result, output_dir(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
