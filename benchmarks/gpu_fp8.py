"""FP8 weights on one GPU: the matmul kernels per shape, then the 8B-shaped engine in FP8 against bf16.

    python -m benchmarks.gpu_fp8            # on a CUDA machine; writes benchmarks/results/gpu_fp8.json
    python -m benchmarks.gpu_fp8 --skip-engine   # the kernel table alone

In one run:
- the copy bandwidth (bytes read plus written), the ceiling of every figure here;
- each linear layer of Llama-3.1-8B (qkv, o, gate/up, down) at 1 to 64 rows: bf16 through the engine's
  own choice (the Triton GEMV for one row, cuBLAS above), and FP8 through each candidate (the GEMV with
  scales, the weight-only Triton GEMM in a few tilings, cuBLAS's row-scaled FP8 GEMM with the activations
  quantized per row), every one checked against the dequantized weight in float32 first. Timed as CUDA
  graph replays over more than 1 GiB of weight copies, so every weight byte comes from memory, as in a
  decode step;
- the 8B-shaped random checkpoint (make-model on the GPU) served in bf16 and in FP8 (quantized at load):
  batch-1 TPOT against each format's roofline (the bytes a step reads over the copy bandwidth), TPOT at
  concurrency 64, and FP8's greedy agreement with bf16 over 8 prompts x 128 tokens, both free-running and
  teacher-forced (FP8's top-1 after each bf16 prefix, one single-token request per position);
- the same agreement for the checkpoint served in float32: how far rounding alone, bf16's against float32's,
  moves this random model's top-1, the floor FP8's figure is read against;
- bf16 and FP8 served again with every kernel launched the ordinary way (`KVFERRY_PDL=0`): what programmatic
  dependent launch (kernels/pdl.py) gains.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.gpu_roofline import Roofline, copy_bandwidth, matmul_rate, model_cost
from benchmarks.gpu_serving import gpu_facts, prompts, run_kvferry_case
from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.results import new_result, params_of, write_result
from kvferry.engine import LLMEngine, SamplingParams
from kvferry.engine.engine_args import EngineArgs
from kvferry.engine.make_model import make_model
from kvferry.kernels import dispatch as kernels
from kvferry.kernels import pdl
from kvferry.kernels.fp8_linear import scaled_mm
from kvferry.kernels.fp8_weight import quantize_fp8

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
ROWS = (1, 8, 16, 32, 64)
ROTATE_BYTES = 1 << 30
AGREEMENT_PROMPTS, AGREEMENT_TOKENS, PROMPT_LEN = 8, 128, 64
MAX_MODEL_LEN = 2048


def _graph_ms(calls: list[Callable[[], object]], replays: int = 10) -> float:
    """Median ms per call of a graph that makes every call once (each over another weight copy)."""
    for call in calls[:2]:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / len(calls))
    return sorted(times)[len(times) // 2]


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).norm() / want.norm())


def fp8_candidates() -> dict[str, Callable[..., torch.Tensor | None]]:
    """Each FP8 kernel and tiling by name: the one-row GEMV (integer widening), the weight-only GEMM, and
    cuBLAS."""
    from kvferry.kernels.triton_batch_gemm import GemmTiling, batch_gemm
    from kvferry.kernels.triton_fp8_gemv import Fp8GemvTiling, fp8_gemv

    candidates: dict[str, Callable[..., torch.Tensor | None]] = {"scaled_mm": lambda x, w: scaled_mm(x, w)}
    for n, words, warps in ((4, 512, 4), (8, 512, 4), (4, 1024, 4), (2, 512, 4)):
        candidates[f"gemv n{n} w{words} warps{warps}"] = partial(
            lambda x, w, tiling: fp8_gemv(x, w.data, w.scale, tiling) if x.shape[0] == 1 else None,
            tiling=Fp8GemvTiling(n, words, warps),
        )
    for n, k, warps, stages in ((64, 128, 4, 4), (32, 128, 4, 4), (32, 256, 4, 3), (16, 128, 4, 4)):
        candidates[f"gemm n{n} k{k} w{warps} s{stages}"] = partial(
            lambda x, w, tiling: batch_gemm(x, w.data, w.scale, tiling), tiling=GemmTiling(n, k, warps, stages)
        )
    return candidates


def linear_rows(bandwidth: float) -> list[dict[str, Any]]:
    rows = []
    generator = torch.Generator(device="cuda").manual_seed(0)
    for shape, (n, k) in SHAPES.items():
        bf16 = (torch.randn(n, k, device="cuda", generator=generator) * k**-0.5).to(torch.bfloat16)
        fp8 = quantize_fp8(bf16)
        copies = max(2, -(-ROTATE_BYTES // fp8.data.numel()))
        fp8_copies = [fp8] + [type(fp8)(fp8.data.clone(), fp8.scale.clone()) for _ in range(copies - 1)]
        bf16_copies = [bf16] + [bf16.clone() for _ in range(max(1, copies // 2) - 1)]
        for m in ROWS:
            x = torch.randn(m, k, device="cuda", generator=generator).to(torch.bfloat16)
            want = F.linear(x.float(), fp8.dequantize(torch.float32))
            bf16_ms = _graph_ms([partial(kernels.linear, x, w) for w in bf16_copies])
            row: dict[str, Any] = {"shape": shape, "n": n, "k": k, "rows": m, "bf16_ms": bf16_ms,
                                   "bf16_tb_s": 2 * n * k / bf16_ms / 1e9, "fp8": {}}  # fmt: skip
            for name, run in fp8_candidates().items():
                try:
                    got = run(x, fp8)
                    if got is None:
                        continue
                    error = _relative_error(got, want)
                    ms = _graph_ms([partial(run, x, w) for w in fp8_copies])
                except Exception as exc:  # a tiling a shape cannot take is recorded, not fatal
                    row["fp8"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:160]}"}
                    continue
                row["fp8"][name] = {"ms": ms, "relative_error": error, "tb_s": n * k / ms / 1e9}
            timed = {name: v for name, v in row["fp8"].items() if "ms" in v and v["relative_error"] < 0.05}
            best = min(timed, key=lambda name: timed[name]["ms"])
            row |= {"best_fp8": best, "best_fp8_ms": timed[best]["ms"], "speedup_vs_bf16": bf16_ms / timed[best]["ms"],
                    "best_fp8_pct_copy_bw": 100 * (n * k / (timed[best]["ms"] / 1e3)) / bandwidth}  # fmt: skip
            engine_choice = kernels.linear(x, fp8)  # what the engine runs for this shape now
            row["engine_choice_relative_error"] = _relative_error(engine_choice, want)
            row["engine_choice_ms"] = _graph_ms([partial(kernels.linear, x, w) for w in fp8_copies])
            rows.append(row)
            print(f"{shape:8s} x{m:3d}: bf16 {bf16_ms * 1e3:7.1f} us, best fp8 {row['best_fp8_ms'] * 1e3:7.1f} us "
                  f"({best}, {row['speedup_vs_bf16']:.2f}x), engine's fp8 {row['engine_choice_ms'] * 1e3:7.1f} us",
                  flush=True)  # fmt: skip
        del bf16, fp8, fp8_copies, bf16_copies
        torch.cuda.empty_cache()
    return rows


def _engine(model: Path, dtype: str, quantization: str | None) -> LLMEngine:
    return LLMEngine(model, EngineArgs(dtype=dtype, quantization=quantization, max_model_len=MAX_MODEL_LEN,
                                       max_num_seqs=64, max_num_batched_tokens=8192, kv_cache_bytes=16 << 30))  # fmt: skip


def _greedy(engine: LLMEngine, prompt_ids: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for index, ids in enumerate(prompt_ids):
        engine.add_request(f"g{index}-{max_tokens}-{len(ids)}", {"prompt_token_ids": ids}, params)
    done: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                done[output.request_id] = output.outputs[0].token_ids
    return [done[f"g{index}-{max_tokens}-{len(ids)}"] for index, ids in enumerate(prompt_ids)]


def serve(engine: LLMEngine, roofline: Roofline) -> dict[str, Any]:
    vocab = engine.model_config.vocab_size
    run_kvferry_case(engine, prompts(2, 64, vocab, seed=99), 8)  # compiles
    figures: dict[str, Any] = {"weight_bytes": roofline.model.weight_bytes}
    for concurrency in (1, 64):
        run_kvferry_case(engine, prompts(concurrency, 128, vocab, seed=1000 + concurrency), 2)
        measured = run_kvferry_case(engine, prompts(concurrency, 128, vocab, seed=concurrency), 128)
        _, roof_tpot = roofline.case(128, 128, concurrency)
        figures[f"c{concurrency}"] = {**measured, "roofline_tpot_ms": 1e3 * roof_tpot,
                                      "fraction_of_roofline_tpot": 1e3 * roof_tpot / measured["tpot_ms"]}  # fmt: skip
    return figures


def agreement(bf16_outputs: list[list[int]], fp8_free: list[list[int]], fp8_forced: list[int]) -> dict[str, Any]:
    positions = sum(len(out) for out in bf16_outputs)
    same_free = sum(a == b for want, got in zip(bf16_outputs, fp8_free, strict=True) for a, b in zip(want, got, strict=True))
    firsts = [next((i for i, (a, b) in enumerate(zip(w, g, strict=True)) if a != b), len(w))
              for w, g in zip(bf16_outputs, fp8_free, strict=True)]  # fmt: skip
    expected = [token for out in bf16_outputs for token in out]
    forced = sum(a == b for a, b in zip(expected, fp8_forced, strict=True))
    return {"positions": positions, "teacher_forced_top1": forced / positions, "free_running_same": same_free / positions,
            "first_parting_per_prompt": firsts}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, "gpu_fp8")
    parser.add_argument("--model", type=Path, default=Path("/tmp/kvferry-llama-8b-shape"))
    parser.add_argument("--skip-engine", action="store_true")
    args = parser.parse_args(argv)
    folder = output_dir(args)
    summary: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    facts = gpu_facts()

    def save() -> None:
        write_result(new_result("gpu_fp8", params_of(args), rows, summary=summary, environment=facts), folder)

    bandwidth = copy_bandwidth()
    flops = matmul_rate()
    summary["copy_bandwidth_tb_s"] = bandwidth / 1e12
    print(f"copy {bandwidth / 1e12:.2f} TB/s", flush=True)
    rows.extend(linear_rows(bandwidth))
    save()
    if args.skip_engine:
        return 0
    if not (args.model / "config.json").is_file():
        make_model("llama", "8b-shape", args.model, seed=0, dtype="bfloat16", num_shards=4, device="cuda")
        os.sync()
        torch.cuda.empty_cache()
    vocab_prompts = None
    outputs: dict[str, Any] = {}
    # bf16 first: its greedy tokens are what FP8, and float32 as the measure of how much any rounding moves
    # this random model's top-1, are held against. Each 16-bit format is also served with every kernel
    # launched the ordinary way (KVFERRY_PDL=0, kernels/pdl.py), the baseline of programmatic launch.
    for name, dtype, quantization in (("bf16", "bfloat16", None), ("bf16_no_pdl", "bfloat16", None),
                                      ("fp8", "bfloat16", "fp8"), ("fp8_no_pdl", "bfloat16", "fp8"),
                                      ("fp32", "float32", None)):  # fmt: skip
        os.environ[pdl.VARIABLE] = "0" if name.endswith("_no_pdl") else "1"
        started = time.perf_counter()
        engine = _engine(args.model, dtype, quantization)
        summary[f"{name}_start_s"] = time.perf_counter() - started
        vocab_prompts = vocab_prompts or prompts(AGREEMENT_PROMPTS, PROMPT_LEN, engine.model_config.vocab_size, seed=7)
        if name != "fp32":  # float32 is here for its tokens alone
            summary[name] = serve(engine, Roofline(bandwidth, flops, model_cost(engine)))
            c1 = summary[name]["c1"]
            print(f"{name}: batch-1 TPOT {c1['tpot_ms']:.2f} ms (roofline {c1['roofline_tpot_ms']:.2f}, "
                  f"{c1['fraction_of_roofline_tpot']:.0%}), c64 TPOT {summary[name]['c64']['tpot_ms']:.2f} ms", flush=True)  # fmt: skip
        if not name.endswith("_no_pdl"):
            outputs[name] = _greedy(engine, vocab_prompts, AGREEMENT_TOKENS)
        if name in ("fp8", "fp32"):
            prefixes = [ids + out[:t] for ids, out in zip(vocab_prompts, outputs["bf16"], strict=True) for t in range(len(out))]
            forced = [out[0] for out in _greedy(engine, prefixes, 1)]
            key = "agreement" if name == "fp8" else "fp32_agreement_with_bf16"
            summary[key] = agreement(outputs["bf16"], outputs[name], forced)
            print(f"{name} against bf16: {summary[key]}", flush=True)
        save()
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    os.environ.pop(pdl.VARIABLE)
    for name in ("bf16", "fp8"):
        summary[f"{name}_pdl_speedup_batch1_tpot"] = summary[f"{name}_no_pdl"]["c1"]["tpot_ms"] / summary[name]["c1"]["tpot_ms"]
        print(f"{name}: programmatic launch {summary[f'{name}_pdl_speedup_batch1_tpot']:.3f}x at batch 1", flush=True)
    summary["fp8_speedup_batch1_tpot"] = summary["bf16"]["c1"]["tpot_ms"] / summary["fp8"]["c1"]["tpot_ms"]
    print(f"FP8 batch-1 TPOT {summary['fp8_speedup_batch1_tpot']:.2f}x bf16", flush=True)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
