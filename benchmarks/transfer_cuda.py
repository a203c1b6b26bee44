"""CUDA pool to CUDA pool through kvferry's transfer engine, beside a torch device-to-device copy.

Two processes on one GPU, UCX CUDA IPC between them; the torch copy of the same bytes in one process is
the limit.

Pools are shaped like an 8B model's KV (32 layers, 8 KV heads, head dim 128, bf16, 16-token blocks:
2 MiB a block). Three block patterns: runs of 64 blocks (one 128 MiB message), runs of 8 (16 MiB
messages) and scattered single blocks (2 MiB messages).

    python -m benchmarks.transfer_cuda        # on a machine with a CUDA GPU; writes results/transfer_cuda.json
"""

from __future__ import annotations

import random
import statistics
import sys
import time

import torch

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.registry import temporary_registry
from benchmarks.harness.results import new_result, params_of, write_result
from benchmarks.harness.table import print_table
from kvferry.transfer import TransferEngine
from kvferry.transfer.kv_connector import DestinationHandle, KVSender, pool_description

SHAPE = {"num_layers": 32, "kv_heads": 8, "head_dim": 128}
NUM_BLOCKS, BATCH_BLOCKS, RUNS = 512, 64, 8


def copy_gbps(nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(RUNS + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return nbytes / statistics.median(times[2:]) / 1e9


def pattern(name: str, rng: random.Random) -> tuple[list[int], list[int]]:
    if name == "runs of 64":
        return list(range(1, 65)), list(range(100, 164))
    if name == "runs of 8":
        starts = rng.sample(range(0, 60), 8)
        return list(range(1, 65)), [b for s in starts for b in range(s * 8 + 1, s * 8 + 9)][:64]
    return rng.sample(range(1, NUM_BLOCKS), BATCH_BLOCKS), rng.sample(range(1, NUM_BLOCKS), BATCH_BLOCKS)


def main(argv: list[str] | None = None) -> int:
    args = benchmark_parser(__doc__, "transfer_cuda").parse_args(argv)
    # The transfer peer is the tests' own (tests/support/), found because benchmarks run from the checkout
    # root; imported here so that the module loads where `tests` is not importable (the unit tests).
    from tests.support.peer_process import PeerProcess
    from tests.support.transfer_peer import make_pool

    registry = temporary_registry()
    pool = make_pool(
        "bfloat16", NUM_BLOCKS, 16, SHAPE["num_layers"], SHAPE["kv_heads"], SHAPE["head_dim"], "cuda"
    )
    engine = TransferEngine()
    engine.initialize("prefill-bench", registry, "ucx", pool=pool_description("8b-shape", pool))
    sender = KVSender(engine, pool, "8b-shape")
    receiver = PeerProcess(
        "decode-bench",
        registry,
        dtype="bfloat16",
        num_blocks=NUM_BLOCKS,
        device="cuda",
        model="8b-shape",
        **SHAPE,
    )
    rng = random.Random(0)
    batch_bytes = BATCH_BLOCKS * pool.block_bytes()
    limit = copy_gbps(batch_bytes)
    rows = []
    try:
        for name in ("runs of 64", "runs of 8", "scattered"):
            times = []
            for index in range(RUNS + 2):
                src, dst = pattern(name, rng)
                handle = DestinationHandle.from_json(
                    receiver.call("expect", request_id=f"{name}{index}", block_ids=dst)["handle"]
                )
                started = time.perf_counter()
                sender.send_blocks(f"{name}{index}", src, handle)
                times.append(time.perf_counter() - started)
            gbps = batch_bytes / statistics.median(times[2:]) / 1e9
            rows.append(
                {
                    "pattern": name,
                    "batch_mib": batch_bytes >> 20,
                    "kvferry_gbps": round(gbps, 1),
                    "torch_copy_gbps": round(limit, 1),
                    "pct_of_copy": round(100 * gbps / limit, 1),
                    "p99_ms": round(1e3 * sorted(times[2:])[-1], 2),
                }
            )
    finally:
        receiver.close()
        engine.close()
    print_table(rows, list(rows[0]))
    params = {
        **params_of(args),
        **SHAPE,
        "num_blocks": NUM_BLOCKS,
        "batch_blocks": BATCH_BLOCKS,
        "runs": RUNS,
    }
    result = new_result(
        "transfer_cuda", params, rows, notes=["torch copy counts bytes once (not read+write)"]
    )
    print(f"wrote {write_result(result, output_dir(args))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
