"""Offline generation throughput: kvferry's engine beside transformers' batched, padded `generate`.

Both run the same `small` random-weight checkpoint in float32 on the CPU, in one process, one after the
other, on the same prompts. Throughput counts the tokens each request asked for (transformers generates
the whole padded batch to the longest request, which is the cost of static batching). EOS is ignored on
both sides so every request produces exactly its max_tokens.

    .venv/bin/python -m benchmarks.offline_throughput            # both cases
    .venv/bin/python -m benchmarks.offline_throughput --quick    # a smoke run with 8 prompts
"""

from __future__ import annotations

import random
import sys
import time
from functools import partial

import torch

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import cached_model
from benchmarks.harness.results import new_result, params_of, write_result
from benchmarks.harness.table import print_table
from benchmarks.harness.warmup import warm_up
from kvferry.engine import LLM, SamplingParams


def make_case(name: str, count: int, vocab: int, seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    if name == "mixed":
        return [
            ([rng.randrange(vocab) for _ in range(rng.randint(32, 512))], rng.randint(16, 256))
            for _ in range(count)
        ]
    return [([rng.randrange(vocab) for _ in range(128)], 128) for _ in range(count)]


def run_kvferry(llm: LLM, requests: list[tuple[list[int], int]]) -> float:
    prompts = [{"prompt_token_ids": p} for p, _ in requests]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in requests]
    start = time.perf_counter()
    outputs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    assert [len(o.outputs[0].token_ids) for o in outputs] == [n for _, n in requests]
    return elapsed


def run_transformers(model, requests: list[tuple[list[int], int]], pad_id: int) -> float:
    longest = max(len(p) for p, _ in requests)
    input_ids = torch.full((len(requests), longest), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, (prompt, _) in enumerate(requests):  # left padding, as decoder-only generate expects
        input_ids[row, longest - len(prompt) :] = torch.tensor(prompt)
        attention_mask[row, longest - len(prompt) :] = 1
    max_new = max(n for _, n in requests)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max_new,
            min_new_tokens=max_new,
            do_sample=False,
            pad_token_id=pad_id,
        )
    elapsed = time.perf_counter() - start
    assert out.shape[1] == longest + max_new
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, "offline_throughput")
    parser.add_argument("--quick", action="store_true", help="8 prompts per case, for a smoke run")
    parser.add_argument("--size", default="small")
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    model_dir = cached_model("llama", args.size)
    llm = LLM(model_dir, dtype="float32", max_model_len=1024, max_num_seqs=64, max_num_batched_tokens=2048)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # generate to max_new_tokens, as kvferry's ignore_eos does
    vocab = hf.config.vocab_size
    count = 8 if args.quick else 64
    rows = []
    for case in ("mixed", "uniform-128-128"):
        requests = make_case(case, count, vocab)
        tokens = sum(n for _, n in requests)
        warm_up(partial(run_kvferry, llm, requests[:2]))  # first-call allocations on both sides
        kvf_s = run_kvferry(llm, requests)
        hf_s = run_transformers(hf, requests, pad_id=0)
        rows.append(
            {
                "case": case,
                "requests": count,
                "output_tokens": tokens,
                "kvferry_s": round(kvf_s, 2),
                "hf_s": round(hf_s, 2),
                "kvferry_tok_s": round(tokens / kvf_s, 1),
                "hf_tok_s": round(tokens / hf_s, 1),
                "ratio": round(hf_s / kvf_s, 2),
            }
        )
        print_table(rows[-1:], list(rows[-1]))
        sys.stdout.flush()
    print()
    print_table(rows, ["case", "kvferry_tok_s", "hf_tok_s", "ratio"])
    params = {
        **params_of(args),
        "model": f"llama-{args.size} (random weights, float32)",
        "requests_per_case": count,
    }
    print(f"wrote {write_result(new_result('offline_throughput', params, rows), output_dir(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
