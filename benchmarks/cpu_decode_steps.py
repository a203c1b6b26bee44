"""CPU time of one decode step for batches of 1-8 sequences: the prepacked linear path (kvferry's C kernel, or
oneDNN's under KVFERRY_KERNELS=torch; kernels/cpu_linear.py) against F.linear.

The `small` checkpoint (`--model smollm2`: the real default model), float32, one torch thread (`--threads`),
512-token prompts, 16 decode steps per batch; the two
matmul paths take turns batch by batch in one process (`kernels/cpu_linear.PACKED_MAX_ROWS` set to 0
sends every call to F.linear). CPU time of the process, not wall time: other jobs on a shared machine
stretch wall time far more. Writes `benchmarks/results/cpu_decode_steps.json`.

    .venv/bin/python -m benchmarks.cpu_decode_steps [--rounds 2] [--threads 2] [--model smollm2]
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time

import torch

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import cached_model, environment
from benchmarks.harness.results import new_result, params_of, write_result
from benchmarks.harness.table import print_table
from kvferry.engine import LLM, SamplingParams
from kvferry.engine.model_source import default_model
from kvferry.kernels import cpu_linear

BATCHES = (1, 2, 3, 4, 8)
PROMPT_TOKENS = 512
DECODE_STEPS = 16


def median_step_ms(llm: LLM, batch: int, packed_rows: int, rng: random.Random) -> float:
    cpu_linear.PACKED_MAX_ROWS = packed_rows
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=DECODE_STEPS + 1, ignore_eos=True)
    for _ in range(batch):
        prompt = [rng.randrange(1000) for _ in range(PROMPT_TOKENS)]
        engine.add_request(f"r{rng.random()}", {"prompt_token_ids": prompt}, params)
    engine.step()  # the prefill
    step_ms = []
    while engine.has_unfinished_requests():
        start = time.process_time()
        engine.step()
        step_ms.append((time.process_time() - start) * 1000)
    return statistics.median(step_ms)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, "cpu_decode_steps")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", choices=("small", "smollm2"), default="small")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = cached_model("llama", "small") if args.model == "small" else default_model()
    llm = LLM(model, dtype="float32", max_model_len=2048)
    rng = random.Random(0)
    packed_rows = cpu_linear.PACKED_MAX_ROWS
    samples: dict[tuple[int, str], list[float]] = {}
    for _ in range(args.rounds):
        for batch in BATCHES:
            for path, rows in (("f_linear", 0), ("packed", packed_rows)):
                samples.setdefault((batch, path), []).append(median_step_ms(llm, batch, rows, rng))
    rows = []
    for batch in BATCHES:
        f_linear = statistics.median(samples[(batch, "f_linear")])
        packed = statistics.median(samples[(batch, "packed")])
        rows.append(
            {
                "batch": batch,
                "f_linear_ms": round(f_linear, 1),
                "packed_ms": round(packed, 1),
                "speedup": round(f_linear / packed, 2),
            }
        )
    print_table(rows, ["batch", "f_linear_ms", "packed_ms", "speedup"])
    params = {**params_of(args), "prompt_tokens": PROMPT_TOKENS, "decode_steps": DECODE_STEPS}
    result = new_result(
        "cpu_decode_steps", params, rows, environment={**environment(), "load_avg": os.getloadavg()}
    )
    print(f"wrote {write_result(result, output_dir(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
