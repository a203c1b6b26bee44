"""Kernel benchmark on one GPU: paged decode and prefill attention in Triton beside torch SDPA.

In one run: the device-to-device copy bandwidth first (bytes read plus bytes written), the ceiling the
decode numbers are a percentage of; paged decode attention for batch 1/16/64/256 x context 1k/4k/16k/32k
(32 query heads, 8 kv heads, head dim 128, bf16, block size 16) beside SDPA on a contiguous cache of the
same data; prefill attention TFLOP/s beside SDPA's flash backend. Times are medians of CUDA-event timed
CUDA-graph replays with the L2 cleared before each. Bytes are the fewest a kernel must move: K and V of every context
token once, the query, the output, the block tables.

    python -m benchmarks.kernels                 # the full table, written to benchmarks/results/kernels.json
    python -m benchmarks.kernels --tune          # also sweep tilings and split counts at a few shapes
    python -m benchmarks.kernels --quick         # tiny shapes: a smoke run of the script itself
    python -m benchmarks.kernels --markdown      # the tables of an existing kernels.json, for docs/benchmarks.md
"""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.environment import environment as machine_environment
from benchmarks.harness.results import new_result, params_of, read_result, write_result
from benchmarks.harness.schema import BenchmarkResult
from benchmarks.harness.table import print_table
from kvferry.kernels.triton_decode_attention import DecodeTiling, paged_decode_attention
from kvferry.kernels.triton_prefill_attention import PrefillTiling, paged_prefill_attention

Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, DTYPE = 32, 8, 128, 16, torch.bfloat16
DECODE_BATCHES = (1, 16, 64, 256)
DECODE_CONTEXTS = (1024, 4096, 16384, 32768)
# (batch, new tokens, cached tokens): fresh prompts, and an extension over a cached prefix.
PREFILL_CASES = ((1, 16384, 0), (4, 4096, 0), (16, 1024, 0), (8, 512, 4096))
# SDPA's decode baseline: the first backend that takes a one-token query with GQA.
DECODE_SDPA_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH)  # fmt: skip
MEMORY_HEADROOM = 0.85  # of the free device memory a case may take


def gpu_environment() -> dict[str, str]:
    """The facts every row repeats (the GPU, its driver, torch and triton), so that rows from runs on
    different machines stay told apart."""
    try:
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        driver = (
            subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
        )
    except (OSError, subprocess.CalledProcessError, IndexError):
        driver = "unknown"
    import triton

    return {
        "gpu": torch.cuda.get_device_name(),
        "driver": driver,
        "torch": torch.__version__,
        "triton": triton.__version__,
    }


def median_ms(fn: Callable[[], object], reps: int = 30, warmup: int = 3, graph: bool = True) -> float:
    """Median of CUDA-event timings of `fn` captured in a CUDA graph (so host-side launch gaps, which a
    serving engine removes with graphs too, stay out), each replay after reading 512 MB so that no
    input is left in L2. Read, not written: a written flush leaves L2 full of dirty lines whose write-back
    lands inside the timed kernel (7-9 us of a batch-1 attention at 16k context on an H100, ours and SDPA's
    alike), while the kernels before attention in a decode step read weights and leave clean lines.
    Falls back to timing eager calls where capture fails."""
    flush = torch.ones(128 << 20, dtype=torch.float32, device="cuda")
    flush_sum = torch.empty((), dtype=torch.float32, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    run = fn
    try:
        if not graph:
            raise RuntimeError("eager timing asked for")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    except RuntimeError as error:
        if graph:
            print(f"timing eagerly, graph capture failed: {str(error)[:120]}")
    times = []
    for _ in range(reps):
        torch.sum(flush, dim=0, out=flush_sum)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def time_sdpa(backends: tuple[SDPBackend, ...], *args: torch.Tensor, **kwargs: object) -> tuple[float, str]:
    """SDPA's median time under the first of `backends` that accepts the inputs, and that backend's name."""
    sdpa = partial(F.scaled_dot_product_attention, *args, **kwargs)
    for backend in backends:
        with sdpa_kernel([backend]):
            try:
                sdpa()
            except RuntimeError:
                continue
            return median_ms(sdpa), backend.name.lower()
    raise RuntimeError(f"none of {backends} runs these inputs")


def copy_bandwidth_gbps(size_bytes: int = 4 << 30) -> float:
    src = torch.randint(0, 255, (size_bytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    # Eager: a captured device-to-device copy becomes a graph memcpy node that ran on the copy engine at
    # about 2.8 TB/s on an H200, against 4.3 TB/s for the SM copy kernel an eager copy_ launches.
    ms = median_ms(lambda: dst.copy_(src), reps=20, graph=False)
    return 2 * size_bytes / ms / 1e6


def fits(bytes_needed: int) -> bool:
    free, _ = torch.cuda.mem_get_info()
    return bytes_needed < MEMORY_HEADROOM * free


class PagedCase:
    """Random K/V for `batch` sequences of `context` tokens, in a pool of scattered blocks (the engine's
    [blocks, layers, K/V, slot, head, dim] layout, one layer) and, for SDPA, contiguous [batch, heads,
    context, dim] copies of the same values."""

    def __init__(self, batch: int, context: int, generator: torch.Generator, contiguous: bool = True) -> None:
        blocks_per_seq = -(-context // BLOCK_SIZE)
        num_blocks = batch * blocks_per_seq + 1
        self.pool = torch.randn(num_blocks, 1, 2, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda",
                                generator=generator)  # fmt: skip
        self.key_cache, self.value_cache = self.pool[:, 0, 0], self.pool[:, 0, 1]
        order = torch.randperm(num_blocks - 1, device="cuda", generator=generator) + 1
        self.block_tables = order.view(batch, blocks_per_seq)
        self.context_lens = torch.full((batch,), context, dtype=torch.long, device="cuda")
        if contiguous:
            shape = (batch, KV_HEADS, context, HEAD_DIM)
            self.keys = torch.empty(shape, dtype=DTYPE, device="cuda")
            self.values = torch.empty(shape, dtype=DTYPE, device="cuda")
            for seq in range(batch):  # one sequence at a time keeps the gather's temporary small
                table = self.block_tables[seq]
                self.keys[seq] = self.key_cache[table].flatten(0, 1)[:context].transpose(0, 1)
                self.values[seq] = self.value_cache[table].flatten(0, 1)[:context].transpose(0, 1)

    def attention_args(self, query: torch.Tensor, *rest: object) -> tuple[object, ...]:
        """The paged kernels' leading arguments for `query`, then `rest` (prefill's starts, the scale)."""
        return (query, self.key_cache, self.value_cache, self.block_tables, self.context_lens, *rest)

    def kv_bytes(self) -> int:
        batch, context = self.context_lens.shape[0], int(self.context_lens[0])
        return 2 * batch * context * KV_HEADS * HEAD_DIM * self.pool.element_size()


def decode_rows(copy_gbps: int, env: dict[str, str], batches, contexts, generator) -> list[dict[str, object]]:
    rows = []
    # Smallest first: a case measured right after a larger one was freed ran up to 20% slower on an H100
    # (batch 1 x 32k after 256 x 16k: ours 61 us against 52 fresh, SDPA 68 against 60; 16 x 32k: ours 823
    # against 689, SDPA unchanged), and a serving engine allocates its pool once.
    for batch, context in sorted(itertools.product(batches, contexts), key=math.prod):
        kv_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * 2
        row = {"kernel": "paged_decode_attention", "batch": batch, "context": context, **env}
        if not fits(2 * kv_bytes + (256 << 20)):
            rows.append({**row, "gbps": None, "pct_copy_bw": None, "sdpa_ratio": None,
                         "note": f"skipped: {2 * kv_bytes / 1e9:.0f} GB of paged + contiguous K/V does not fit"})  # fmt: skip
            continue
        case = PagedCase(batch, context, generator)
        query = torch.randn(batch, Q_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda", generator=generator)
        args = case.attention_args(query, HEAD_DIM**-0.5)
        ours_ms = median_ms(partial(paged_decode_attention, *args))
        sdpa_ms, backend = time_sdpa(DECODE_SDPA_BACKENDS, query.unsqueeze(2), case.keys, case.values,
                                     enable_gqa=True)  # fmt: skip
        moved = kv_bytes + 2 * query.numel() * 2 + case.block_tables.numel() * 8
        gbps = moved / ours_ms / 1e6
        rows.append({**row, "ms": round(ours_ms, 4), "sdpa_ms": round(sdpa_ms, 4), "bytes": moved,
                     "gbps": round(gbps, 1), "pct_copy_bw": round(100 * gbps / copy_gbps, 1),
                     "sdpa_gbps": round(moved / sdpa_ms / 1e6, 1), "sdpa_ratio": round(sdpa_ms / ours_ms, 3), "sdpa_backend": backend})  # fmt: skip
        del case, args, query
        torch.cuda.empty_cache()
    rows.sort(key=lambda row: (row["context"], row["batch"]))  # the table's order
    return rows


def _causal_flops(batch: int, new: int, cached: int) -> int:
    """Two matmuls of 2 * head_dim FLOPs per (query, visible key) pair, per query head."""
    visible = new * cached + new * (new + 1) // 2
    return 4 * HEAD_DIM * Q_HEADS * batch * visible


def prefill_rows(copy_gbps: float, env: dict[str, str], cases, generator) -> list[dict[str, object]]:
    rows = []
    for batch, new, cached in cases:
        context = cached + new
        case = PagedCase(batch, context, generator)
        query = torch.randn(batch, Q_HEADS, new, HEAD_DIM, dtype=DTYPE, device="cuda", generator=generator)
        packed_query = query.transpose(1, 2).reshape(batch * new, Q_HEADS, HEAD_DIM)
        starts = torch.arange(batch + 1, device="cuda") * new
        args = case.attention_args(packed_query, starts, HEAD_DIM**-0.5)
        ours_ms = median_ms(partial(paged_prefill_attention, *args))
        mask = causal_lower_right(new, context)
        try:
            sdpa_ms, backend = time_sdpa((SDPBackend.FLASH_ATTENTION,), query, case.keys, case.values,
                                         attn_mask=mask, enable_gqa=True)  # fmt: skip
        except RuntimeError:  # a flash build without GQA: give it K/V repeated per query head (not timed)
            group = Q_HEADS // KV_HEADS
            keys, values = case.keys.repeat_interleave(group, 1), case.values.repeat_interleave(group, 1)
            sdpa_ms, backend = time_sdpa((SDPBackend.FLASH_ATTENTION,), query, keys, values, attn_mask=mask)
            backend += " (k/v repeated per query head)"
            del keys, values
        flops = _causal_flops(batch, new, cached)
        moved = case.kv_bytes() + 2 * query.numel() * 2
        gbps = moved / ours_ms / 1e6
        rows.append({"kernel": "paged_prefill_attention", "batch": batch, "context": context, "new_tokens": new,
                     **env, "ms": round(ours_ms, 4), "sdpa_ms": round(sdpa_ms, 4),
                     "tflops": round(flops / ours_ms / 1e9, 1), "sdpa_tflops": round(flops / sdpa_ms / 1e9, 1),
                     "gbps": round(gbps, 1), "pct_copy_bw": round(100 * gbps / copy_gbps, 1),
                     "sdpa_ratio": round(sdpa_ms / ours_ms, 3), "sdpa_backend": backend})  # fmt: skip
        del case, args, query, packed_query
        torch.cuda.empty_cache()
    return rows


def tune(generator: torch.Generator) -> list[dict[str, object]]:
    """Decode tilings and split counts, prefill tilings, at the shapes the targets name (ms, lower wins)."""
    rows = []
    for batch, context in ((64, 4096), (1, 16384), (1, 32768), (16, 16384), (256, 1024)):
        case = PagedCase(batch, context, generator, contiguous=False)
        query = torch.randn(batch, Q_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda", generator=generator)
        args = case.attention_args(query, HEAD_DIM**-0.5)
        for block_n in (32, 64, 128):
            for num_warps in (4, 8):
                for num_stages in (2, 3, 4):
                    tiling = DecodeTiling(block_n, num_warps, num_stages)
                    ms = median_ms(partial(paged_decode_attention, *args, tiling=tiling), reps=15)
                    rows.append(
                        {
                            "kernel": "decode",
                            "batch": batch,
                            "context": context,
                            "tiling": str(tiling),
                            "ms": ms,
                        }
                    )
        for num_splits in (1, 2, 3, 4, 8, 16, 32, 48, 64):
            ms = median_ms(partial(paged_decode_attention, *args, num_splits=num_splits), reps=15)
            rows.append(
                {"kernel": "decode", "batch": batch, "context": context, "num_splits": num_splits, "ms": ms}
            )
        del case, args
    batch, new = 4, 4096
    case = PagedCase(batch, new, generator, contiguous=False)
    query = torch.randn(batch * new, Q_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda", generator=generator)
    starts = torch.arange(batch + 1, device="cuda") * new
    args = case.attention_args(query, starts, HEAD_DIM**-0.5)
    flops = _causal_flops(batch, new, 0)
    for tiling in (PrefillTiling(128, 64, 8, 3), PrefillTiling(128, 64, 4, 3), PrefillTiling(128, 128, 8, 3),
                   PrefillTiling(128, 32, 4, 3), PrefillTiling(64, 64, 4, 3), PrefillTiling(128, 64, 8, 2),
                   PrefillTiling(128, 128, 8, 2), PrefillTiling(64, 128, 4, 2)):  # fmt: skip
        try:
            ms = median_ms(partial(paged_prefill_attention, *args, tiling=tiling), reps=10)
        except Exception as error:  # a tiling that needs more shared memory than the chip has
            rows.append({"kernel": "prefill", "tiling": str(tiling), "error": str(error)[:200]})
            continue
        rows.append({"kernel": "prefill", "batch": batch, "context": new, "tiling": str(tiling), "ms": ms,
                     "tflops": round(flops / ms / 1e9, 1)})  # fmt: skip
    return rows


def markdown(result: BenchmarkResult) -> str:
    """docs/benchmarks.md's tables from a result."""
    env, rows = result.environment, result.rows
    lines = [f"{env['gpu']}, driver {env['driver']}, torch {env['torch']}, triton {env['triton']}; "
             f"device-to-device copy {result.summary['copy_gbps']:.0f} GB/s (read + write).", "",
             "| batch | context | ours ms | GB/s | % of copy | SDPA ms | SDPA / ours |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if r["kernel"] != "paged_decode_attention":
            continue
        if r["gbps"] is None:
            lines.append(f"| {r['batch']} | {r['context']} | {r['note']} | | | | |")
        else:
            lines.append(f"| {r['batch']} | {r['context']} | {r['ms']:.3f} | {r['gbps']:.0f} | {r['pct_copy_bw']:.0f}% "
                         f"| {r['sdpa_ms']:.3f} | {r['sdpa_ratio']:.2f} |")  # fmt: skip
    lines += ["", "| batch | new tokens | cached | ours ms | TFLOP/s | SDPA flash TFLOP/s | SDPA / ours |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if r["kernel"] == "paged_prefill_attention":
            lines.append(f"| {r['batch']} | {r['new_tokens']} | {r['context'] - r['new_tokens']} | {r['ms']:.3f} "
                         f"| {r['tflops']:.0f} | {r['sdpa_tflops']:.0f} | {r['sdpa_ratio']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, "kernels", out_alias=False)
    parser.add_argument(
        "--quick", action="store_true", help="tiny shapes: checks the script, not the kernels"
    )
    parser.add_argument("--tune", action="store_true", help="also sweep tilings and split counts")
    parser.add_argument(
        "--out", type=Path, default=None, help="the result file (default: kernels.json in --results-dir)"
    )
    parser.add_argument("--markdown", action="store_true", help="print the tables of the result and exit")
    args = parser.parse_args(argv)
    out = args.out or output_dir(args) / "kernels.json"
    if args.markdown:
        print(markdown(read_result(out)))
        return 0
    if not torch.cuda.is_available():
        sys.exit("benchmarks/kernels.py needs a CUDA device")
    generator = torch.Generator(device="cuda").manual_seed(0)
    env = gpu_environment()
    copy_gbps = copy_bandwidth_gbps(256 << 20 if args.quick else 4 << 30)
    print(f"{env}\ndevice-to-device copy: {copy_gbps:.0f} GB/s (read + write)")
    batches, contexts = ((1, 4), (256, 1024)) if args.quick else (DECODE_BATCHES, DECODE_CONTEXTS)
    rows = decode_rows(copy_gbps, env, batches, contexts, generator)
    rows += prefill_rows(
        copy_gbps, env, ((2, 256, 0), (2, 128, 256)) if args.quick else PREFILL_CASES, generator
    )
    summary: dict[str, object] = {"copy_gbps": round(copy_gbps, 1)}
    if args.tune:
        summary["tuning"] = tune(generator)
    params = params_of(args, leave_out=("results_dir", "out", "markdown"))
    result = new_result(
        "kernels", params, rows, summary=summary, environment={**machine_environment(), **env}
    )
    write_result(result, out.parent, out.stem)
    print_table([r for r in rows if r["kernel"] == "paged_decode_attention" and r["gbps"] is not None],
                ["batch", "context", "ms", "sdpa_ms", "gbps", "pct_copy_bw", "sdpa_ratio"])  # fmt: skip
    print_table([r for r in rows if r["kernel"] == "paged_prefill_attention"],
                ["batch", "context", "new_tokens", "ms", "tflops", "sdpa_tflops", "sdpa_ratio"])  # fmt: skip
    for row in rows:
        if "note" in row:
            print(f"batch {row['batch']} context {row['context']}: {row['note']}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
