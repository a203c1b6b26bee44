"""Where a decode step's GPU time goes: kernel time by kind beside the step's CUDA graph replay.

Kernel time by kind (matmuls, attention, norms, ...) and the time of the step's CUDA graph replay, at
batch 1, 64 and 256.

    python -m benchmarks.gpu_decode_profile --model DIR   # on a CUDA machine

Each batch size first serves real requests (8 new tokens each), then its graph's inputs are written for a
step at the context those requests reached (every row reading the same blocks, so their KV comes mostly
from L2), and that step is replayed (timed with events), run once eagerly under the profiler (kernel time
by kind), and replayed once under the profiler: the replay's timeline gives the GPU's busy and idle time
and where the idle time sits (between which kinds of kernel). The prompts are as long as lets the whole
batch into one prefill step (1024 tokens at batch 1, 128 at 64, 32 at 256).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import torch

from benchmarks.gpu_serving import graph_replay_ms, prompts, run_kvferry_case
from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.kernel_timeline import Kernel, idle_gaps
from benchmarks.harness.results import new_result, params_of, write_result
from kvferry.engine import LLMEngine
from kvferry.engine.engine_args import EngineArgs

KINDS = (("matmul", ("gemm", "gemv", "cutlass", "nvjet", "sm90", "cublas")), ("attention", ("_decode_",)),
         ("norm", ("_rms_norm",)), ("rope + kv store", ("_rope", "_store_kv")), ("silu-mul", ("silu",)))  # fmt: skip


def kind_of(kernel: str) -> str:
    lowered = kernel.lower()
    return next((kind for kind, marks in KINDS if any(mark in lowered for mark in marks)), "other")


def profile_step(engine: LLMEngine, size: int, context: int) -> dict[str, object]:
    """The step's replay time, its eager twin's kernel time by kind, and the replay's own timeline, all of one
    step: graph_replay_ms writes the graph's inputs, which the eager twin reads too (the same buffers). Before
    2026-12-07 the replay was timed at 1152 tokens of context and the eager step at the requests' own, so at
    batch 64 and 256 the two were different steps."""
    graphs = engine.runner.graphs
    replay_ms = graph_replay_ms(engine, size, context)
    graphs._forward(size)  # noqa: SLF001 - the eager twin of the graph, over the same buffers
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        with torch.inference_mode():
            graphs._forward(size)  # noqa: SLF001
        torch.cuda.synchronize()
    by_kind: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for event in profiler.key_averages():
        device_us = getattr(event, "device_time_total", 0) or getattr(event, "cuda_time_total", 0)
        if device_us:
            by_kind[kind_of(event.key)] += device_us / 1e3
            counts[kind_of(event.key)] += event.count
    return {"graph_replay_ms": replay_ms, "kernel_ms_by_kind": dict(by_kind), "kernels_by_kind": dict(counts),
            "kernel_ms_total": sum(by_kind.values()),
            "replay_timeline": None if replay_ms is None else replay_timeline(graphs.graphs[size])}  # fmt: skip


def replay_timeline(graph: torch.cuda.CUDAGraph) -> dict[str, object]:
    """One replay under the profiler: its kernels' busy and idle time, and the idle time by transition (empty
    where the profiler reports no kernels inside a graph)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
        graph.replay()
        torch.cuda.synchronize()
    kernels = [Kernel(event.name, event.time_range.start, event.time_range.end) for event in profiler.events()
               if event.device_type == torch.autograd.DeviceType.CUDA]  # fmt: skip
    return idle_gaps(kernels, kind_of)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, "gpu_decode_profile")
    parser.add_argument("--model", required=True)
    args = parser.parse_args(argv)
    budget = 8192
    engine = LLMEngine(args.model, EngineArgs(dtype="bfloat16", max_model_len=2048, max_num_seqs=256,
                                              max_num_batched_tokens=budget))  # fmt: skip
    vocab = engine.model_config.vocab_size
    rows = []
    for size in (1, 64, 256):
        prompt_len = min(1024, budget // size)
        run_kvferry_case(engine, prompts(size, prompt_len, vocab, seed=size), 8)
        context = prompt_len + 7
        rows.append({"batch": size, "context_tokens": context, **profile_step(engine, size, context)})
        print(f"batch {size}: {json.dumps(rows[-1])}", flush=True)
    params = {**params_of(args), "max_num_batched_tokens": budget}
    print(f"wrote {write_result(new_result('gpu_decode_profile', params, rows), output_dir(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
