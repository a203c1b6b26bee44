"""Probe: a Triton GEMV against cuBLAS (F.linear) for the batch-1 decode matmuls of the 8B shape.

    python -m benchmarks.gpu_gemv_probe    # on a CUDA machine; prints a table, writes nothing

Each shape is timed as CUDA-graph replays over enough weight copies (>= 1 GiB) that nothing is served
from L2, as in a decode step where every weight is read once. GB/s counts the weight bytes read.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
          "lm_head": (128256, 4096)}  # fmt: skip
CONFIGS = list(itertools.product((4, 8, 16), (512, 1024, 2048), (4, 8)))  # BLOCK_N, BLOCK_K, num_warps


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, out_ptr, N, K, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_wn + cols[None, :]
    for k in range(0, K, BLOCK_K):  # K is a multiple of BLOCK_K
        w = tl.load(w_ptrs + k, mask=row_mask[:, None], other=0.0)
        x = tl.load(x_ptr + k + cols)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    tl.store(out_ptr + rows, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=row_mask)


def gemv(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, block_n: int, block_k: int, warps: int) -> None:
    n, k = w.shape
    _gemv_kernel[(triton.cdiv(n, block_n),)](x, w, out, n, k, w.stride(0), BLOCK_N=block_n, BLOCK_K=block_k,
                                             num_warps=warps)  # fmt: skip


def graph_ms(fn, copies: int, reps: int = 5) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(copies):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(copies):
            fn(i)
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / copies)
    return sorted(times)[len(times) // 2]


def probe(name: str, n: int, k: int) -> str:
    nbytes = n * k * 2
    copies = max(2, -(-(1 << 30) // nbytes))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    outs = [torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    cublas = graph_ms(lambda i: torch.nn.functional.linear(x, weights[i], out=outs[i]), copies)
    want = torch.nn.functional.linear(x.float(), weights[0].float())
    best: tuple[float, tuple[int, int, int] | None, float] = (float("inf"), None, 0.0)
    for config in CONFIGS:
        if k % config[1]:
            continue
        ms = graph_ms(lambda i, c=config: gemv(x, weights[i], outs[i], *c), copies)
        gemv(x, weights[0], outs[0], *config)
        err = float((outs[0].float() - want).norm() / want.norm())
        if ms < best[0]:
            best = (ms, config, err)
    return (f"| {name} | {n} x {k} | {cublas * 1e3:.1f} | {nbytes / cublas / 1e6:.0f} | {best[0] * 1e3:.1f} | "
            f"{nbytes / best[0] / 1e6:.0f} | {best[1]} | {best[2]:.1e} |")  # fmt: skip


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()  # no options: --help
    torch.manual_seed(0)
    print("| shape | N x K | cuBLAS us | GB/s | best Triton us | GB/s | config (BLOCK_N, BLOCK_K, warps) | rel err |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (n, k) in SHAPES.items():
        print(probe(name, n, k), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
