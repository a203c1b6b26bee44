"""The link section: a torch copy_ from the first device to the second (the limit), beside kvferry's P -> D
transfer of the same bytes of KV blocks from a pool in this process into one in a peer process."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.gpu_disaggregated import MODEL_NAME
from benchmarks.harness.registry import temporary_registry
from benchmarks.harness.table import print_table
from benchmarks.transfer_cuda import SHAPE
from benchmarks.two_gpus_sections import WARM_RUNS
from kvferry.engine.devices import make_current

# P -> D at least this share of the peer copy.
TRANSFER_TARGET = 0.70


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds `fn` takes: CUDA events on the device's current stream (where torch runs a copy from it to
    another GPU), the wall clock on the CPU."""
    if device.type != "cuda":
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started
    with torch.cuda.device(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def peer_copy(src_device: str, dst_device: str, nbytes: int, runs: int) -> dict[str, float]:
    """torch's copy_ of `nbytes` from one device to the other, median of `runs` after warm-ups."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=src_device)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dst_device)
    for device in {src.device, dst.device}:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    times = [timed(lambda: dst.copy_(src), src.device) for _ in range(runs + WARM_RUNS)][WARM_RUNS:]
    return {"gbps": nbytes / statistics.median(times) / 1e9, "median_ms": 1e3 * statistics.median(times)}


def link(args: argparse.Namespace) -> dict[str, object]:
    """For each prompt length, its KV (contiguous blocks) over UCX from a pool here into a peer process's pool."""
    # The transfer peer is the tests' own (tests/support/), found because benchmarks run from the checkout
    # root; imported here so that the module loads where `tests` is not importable (the unit tests).
    from tests.support.peer_process import PeerProcess
    from tests.support.transfer_peer import block_digests, make_pool

    prefill_device, decode_device = args.devices
    shape = {"num_layers": 4, "kv_heads": 4, "head_dim": 64} if args.quick else SHAPE
    lengths = [int(n) for n in args.lengths.split(",")]
    num_blocks = 1 + max(lengths) // 16 + 1  # the null block, the longest prompt's blocks, one spare
    make_current(torch.device(prefill_device))  # before UCX starts in this thread
    pool = make_pool(
        "bfloat16", num_blocks, 16, shape["num_layers"], shape["kv_heads"], shape["head_dim"], prefill_device
    )
    pool.tensor.view(torch.int16).random_(-(2**15), 2**15 - 1)
    registry = temporary_registry()
    from kvferry.transfer import TransferEngine
    from kvferry.transfer.kv_connector import DestinationHandle, KVSender, pool_description

    engine = TransferEngine()
    engine.initialize("prefill-link", registry, "ucx", pool=pool_description(MODEL_NAME, pool))
    receiver = PeerProcess("decode-link", registry, dtype="bfloat16", num_blocks=num_blocks, device=decode_device,
                           model=MODEL_NAME, block_size=16, **shape)  # fmt: skip
    rows = []
    try:
        sender = KVSender(engine, pool, MODEL_NAME)
        for length in lengths:
            blocks = list(range(1, 1 + length // 16))
            nbytes = len(blocks) * pool.block_bytes()
            copy = peer_copy(prefill_device, decode_device, nbytes, args.runs)
            times = []
            for run in range(args.runs + WARM_RUNS):
                request_id = f"link-{length}-{run}"
                handle = DestinationHandle.from_json(
                    receiver.call("expect", request_id=request_id, block_ids=blocks)["handle"]
                )
                started = time.perf_counter()
                sent = sender.send_blocks(request_id, blocks, handle)
                times.append(time.perf_counter() - started)
                assert sent == nbytes and receiver.call("wait", request_id=request_id)["arrived"], request_id
            ends = [blocks[0], blocks[-1]]  # the bytes arrived, not only the completion
            assert receiver.call("digest", block_ids=ends)["digests"] == block_digests(pool, ends), (
                "KV arrived changed"
            )
            median = statistics.median(times[WARM_RUNS:])
            rows.append({"prompt_tokens": length, "blocks": len(blocks), "mib": nbytes / 2**20,
                         "peer_copy_gbps": _digits(copy["gbps"]), "peer_copy_ms": _digits(copy["median_ms"]),
                         "kvferry_gbps": _digits(nbytes / median / 1e9), "kvferry_ms": _digits(1e3 * median),
                         "kvferry_max_ms": _digits(1e3 * max(times[WARM_RUNS:])),
                         "share_of_copy": _digits(nbytes / median / 1e9 / copy["gbps"])})  # fmt: skip
    finally:
        receiver.close()
        engine.close()
    print_table(rows, list(rows[0]))
    met = all(r["share_of_copy"] >= TRANSFER_TARGET for r in rows)
    print(
        f"P -> D at least {TRANSFER_TARGET:.0%} of the peer copy at every size: {'met' if met else 'missed'}",
        flush=True,
    )
    return {
        "rows": rows,
        "target_share_of_copy": TRANSFER_TARGET,
        "target_met": met,
        "block_bytes": pool.block_bytes(),
    }


def _digits(value: float) -> float:
    """Four significant digits: a CPU smoke run's shares are thousandths, a GPU's GB/s hundreds."""
    return float(f"{value:.4g}")
