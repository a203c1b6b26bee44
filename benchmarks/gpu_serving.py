"""GPU serving on one card: kvferry's engine against transformers `generate` and against the roofline.

    python -m benchmarks.gpu_serving           # on a CUDA machine; writes benchmarks/results/gpu_serving.json
    python -m benchmarks.gpu_serving --plot    # benchmarks/results/gpu_serving.png from that file

In one run: the card's copy bandwidth and bf16 matmul rate; a Llama-3.1-8B-shaped random bf16 checkpoint
drawn on the GPU and written to local disk (`make-model --size 8b-shape`, no weights travel); kvferry's
output tokens/s, TTFT and TPOT at concurrency 1, 8, 64 and 256 for 128-in/128-out, 1024-in/128-out and
128-in/1024-out, each beside its roofline (benchmarks/gpu_roofline.py); the GPU time of one decode graph
replay; then transformers `generate` on the same checkpoint, batched the same way (one batch of
`concurrency` equal-length prompts) to the same output length, best of two runs.
Each case is written as soon as it is measured, and the run stops starting cases past --budget-s, so a
cut-off run still leaves every finished row.
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_roofline import Roofline, copy_bandwidth, matmul_rate, model_cost
from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import environment
from benchmarks.harness.plot import save_plot
from benchmarks.harness.results import new_result, params_of, read_result, write_result
from benchmarks.harness.schema import BenchmarkResult
from kvferry.engine import LLMEngine, SamplingParams
from kvferry.engine.engine_args import EngineArgs
from kvferry.engine.make_model import make_model

CASES = {"128-in/128-out": (128, 128), "1024-in/128-out": (1024, 128), "128-in/1024-out": (128, 1024)}
CONCURRENCY = (1, 8, 64, 256)
MAX_MODEL_LEN = 2048  # the longest case holds 1152 tokens


def gpu_facts() -> dict[str, object]:
    import transformers
    import triton

    query = [
        "nvidia-smi",
        "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
        "--format=csv,noheader",
    ]
    smi = subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip()
    return {**environment(), "nvidia_smi": smi, "triton": triton.__version__, "transformers": transformers.__version__,
            "cuda_runtime": torch.version.cuda}  # fmt: skip


def prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(count)]


def run_kvferry_case(engine: LLMEngine, prompt_ids: list[list[int]], output_len: int) -> dict[str, float]:
    """All requests at once; per request the time of its first and last token."""
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    started = time.perf_counter()
    for index, ids in enumerate(prompt_ids):
        engine.add_request(str(index), {"prompt_token_ids": ids}, params)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            now = time.perf_counter()
            first.setdefault(output.request_id, now)
            if output.finished:
                last[output.request_id] = now
    wall = time.perf_counter() - started
    ttft = [first[r] - started for r in first]
    tpot = [(last[r] - first[r]) / (output_len - 1) for r in last] if output_len > 1 else [0.0]
    return {"wall_s": wall, "kvferry_tok_s": len(prompt_ids) * output_len / wall,
            "ttft_ms": 1e3 * statistics.median(ttft), "tpot_ms": 1e3 * statistics.median(tpot)}  # fmt: skip


def graph_replay_ms(engine: LLMEngine, size: int, context: int = 1152) -> float | None:
    """GPU time of one decode step's graph at `size` rows of `context` tokens, on inputs written here (the
    last step's may be laid out for another size: the graphs share one input buffer). Its rows read
    blocks 1, 2, ... (whatever they hold; every row the same ones, so most of their KV comes from L2) and
    write their new token's KV into the null block."""
    from kvferry.engine.cuda_graphs import CONTEXT_LEN, POSITION, SLOT, TOKEN
    from kvferry.kvcache.allocator import NULL_BLOCK_ID

    graphs = engine.runner.graphs
    if graphs is None or size not in graphs.graphs:
        return None
    inputs = graphs.inputs(size)
    inputs[TOKEN] = 0
    inputs[POSITION] = context - 1
    inputs[SLOT] = NULL_BLOCK_ID * engine.pool.layout.block_size
    inputs[CONTEXT_LEN] = context
    blocks = engine.block_manager.blocks_for(context)
    graphs.block_tables[:size, :blocks] = torch.arange(1, blocks + 1, device=graphs.block_tables.device)
    graph = graphs.graphs[size]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(20):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 20


def run_hf_case(model, prompt_ids: list[list[int]], new_tokens: int, repeats: int = 2) -> float:
    """Output tokens/s of one batched `generate`, the best of `repeats` runs: in the first run on this
    machine transformers ran up to 4x slower on the same case than later (host-bound, like its launches)."""
    ids = torch.tensor(prompt_ids, device="cuda")
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)  # fmt: skip
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
        assert out.shape[1] == ids.shape[1] + new_tokens
    return len(prompt_ids) * new_tokens / best


def plot(result: BenchmarkResult, path: Path) -> Path | None:
    """Output tokens/s against concurrency for kvferry, its roofline and transformers, one panel per case."""
    rows = result.rows
    cases = list(dict.fromkeys(row["case"] for row in rows))
    series = (
        ("roofline_tok_s", "roofline", "k--"),
        ("kvferry_tok_s", "kvferry", "o-"),
        ("hf_tok_s", "transformers", "s-"),
    )

    def draw(pyplot: Any) -> Any:
        figure, axes = pyplot.subplots(1, len(cases), figsize=(5 * len(cases), 4), sharey=True)
        for axis, case in zip(axes, cases, strict=True):
            picked = [row for row in rows if row["case"] == case]
            for key, label, style in series:
                points = [(row["concurrency"], row[key]) for row in picked if row.get(key)]
                axis.plot(*zip(*points, strict=True), style, label=label)
            axis.set(title=case, xscale="log", yscale="log", xlabel="concurrency")
            axis.set_xticks(
                [row["concurrency"] for row in picked], [str(row["concurrency"]) for row in picked]
            )
            axis.grid(True, which="both", alpha=0.3)
        axes[0].set_ylabel("output tokens/s")
        axes[0].legend()
        figure.suptitle(f"Llama-3.1-8B-shaped bf16 model on one {result.environment['cuda']}")
        figure.tight_layout()
        return figure

    return save_plot(path, draw)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, "gpu_serving")
    parser.add_argument("--plot", action="store_true", help="only plot the result in --results-dir, and exit")
    parser.add_argument("--model", type=Path, default=Path("/tmp/kvferry-llama-8b-shape"))
    parser.add_argument("--size", default="8b-shape")
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    parser.add_argument("--budget-s", type=float, default=500, help="start no case after this many seconds")
    args = parser.parse_args(argv)
    folder = output_dir(args)
    if args.plot:
        plot(read_result(folder / "gpu_serving.json"), folder / "gpu_serving.png")
        return 0
    began = time.perf_counter()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    facts = gpu_facts()
    summary: dict[str, Any] = {}  # what is not one case's row
    rows: list[dict[str, Any]] = []

    def save() -> None:
        write_result(
            new_result("gpu_serving", params_of(args), rows, summary=summary, environment=facts), folder
        )

    bandwidth, flops = copy_bandwidth(), matmul_rate()
    summary["ceilings"] = {"copy_bandwidth_tb_s": bandwidth / 1e12, "bf16_matmul_tflop_s": flops / 1e12}
    print(
        f"copy {bandwidth / 1e12:.2f} TB/s (read + write), bf16 matmul {flops / 1e12:.0f} TFLOP/s", flush=True
    )
    if not (args.model / "config.json").is_file():
        t0 = time.perf_counter()
        make_model("llama", args.size, args.model, seed=0, dtype="bfloat16", num_shards=4, device="cuda")
        summary["make_model_s"] = time.perf_counter() - t0
        os.sync()  # 16 GB of dirty pages written back now, not while the host side of a case is timed
        summary["sync_s"] = time.perf_counter() - t0 - summary["make_model_s"]
        print(f"make-model --size {args.size} on the GPU: {summary['make_model_s']:.1f} s", flush=True)
        torch.cuda.empty_cache()

    t0 = time.perf_counter()
    engine = LLMEngine(args.model, EngineArgs(dtype="bfloat16", max_model_len=MAX_MODEL_LEN,
                                              max_num_seqs=max(concurrencies), max_num_batched_tokens=8192))  # fmt: skip
    summary["engine_start_s"] = time.perf_counter() - t0
    summary["kv_pool"] = {
        "blocks": engine.pool.num_blocks,
        "gib": engine.pool.tensor.numel() * engine.pool.tensor.element_size() / 2**30,
    }
    roofline = Roofline(bandwidth, flops, model_cost(engine))
    summary["model_cost"] = vars(roofline.model)
    print(f"engine up in {summary['engine_start_s']:.1f} s, pool {summary['kv_pool']}", flush=True)
    vocab = engine.model_config.vocab_size
    run_kvferry_case(engine, prompts(2, 64, vocab, seed=99), 8)  # warm-up: first prefill shapes

    replay: dict[str, float | None] = {}
    for case, (prompt_len, output_len) in CASES.items():
        for concurrency in concurrencies:
            if time.perf_counter() - began > args.budget_s:
                print(f"skipped {case} x{concurrency}: past the time budget", flush=True)
                continue
            # Triton specializes kernels on argument values (multiples of 16, ones): a short run of the same
            # shape first keeps its compilations out of the timed run.
            run_kvferry_case(engine, prompts(concurrency, prompt_len, vocab, seed=1000 + concurrency), 2)
            measured = run_kvferry_case(
                engine, prompts(concurrency, prompt_len, vocab, seed=concurrency), output_len
            )
            roof_tok_s, roof_tpot = roofline.case(prompt_len, output_len, concurrency)
            row = {"case": case, "concurrency": concurrency, **measured, "roofline_tok_s": roof_tok_s,
                   "roofline_tpot_ms": 1e3 * roof_tpot, "hf_tok_s": None}  # fmt: skip
            row["fraction_of_roofline"] = measured["kvferry_tok_s"] / roof_tok_s
            rows.append(row)
            if case == "128-in/1024-out":
                replay[f"batch {concurrency}"] = graph_replay_ms(engine, concurrency)
            save()
            print(f"kvferry {case} x{concurrency}: {measured['kvferry_tok_s']:.0f} tok/s "
                  f"({row['fraction_of_roofline']:.0%} of roofline {roof_tok_s:.0f}), TPOT {measured['tpot_ms']:.2f} ms "
                  f"(roofline {row['roofline_tpot_ms']:.2f}), TTFT {measured['ttft_ms']:.0f} ms", flush=True)  # fmt: skip
    summary["graph_replay_ms_at_1152_context"] = replay
    save()
    del engine
    gc.collect()
    torch.cuda.empty_cache()

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16, device_map="cuda").eval()
    run_hf_case(model, prompts(2, 64, vocab, seed=99), 32)  # warm-up
    for row in rows:
        if time.perf_counter() - began > args.budget_s:
            print(
                f"transformers {row['case']} x{row['concurrency']}: skipped, past the time budget", flush=True
            )
            continue
        prompt_len, output_len = CASES[row["case"]]  # type: ignore[index]
        try:
            row["hf_tok_s"] = run_hf_case(model, prompts(row["concurrency"], prompt_len, vocab,
                                                         seed=row["concurrency"]), output_len)  # fmt: skip
        except torch.OutOfMemoryError:  # its unpaged cache of a large batch; kvferry's rows stand without it
            row["hf_note"] = "out of memory"
            torch.cuda.empty_cache()
            save()
            print(f"transformers {row['case']} x{row['concurrency']}: out of memory", flush=True)
            continue
        row["speedup_vs_hf"] = row["kvferry_tok_s"] / row["hf_tok_s"]
        save()
        print(f"transformers {row['case']} x{row['concurrency']}: {row['hf_tok_s']:.0f} tok/s "
              f"(kvferry {row['speedup_vs_hf']:.1f}x)", flush=True)  # fmt: skip
    summary["total_s"] = time.perf_counter() - began
    save()
    plot(read_result(folder / "gpu_serving.json"), folder / "gpu_serving.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
