"""Prepared writes against ordinary ones: the KV connector's send after a prefill, host pools, two processes.

    .venv/bin/python -m benchmarks.transfer_prepared [--sizes 65536,1048576,16777216] [--requests 60]

A decode-side process holds a KV pool and a KVReceiver; this process a pool and a KVSender. Each request
reserves blocks on the decode side (the router's order), then either prepares the write before a stand-in
prefill (a 10 ms sleep) and sends after it, as the prefill node does, or writes only after it (the code
before prepared writes). Timed: the send, from the end of the "prefill" to the decode side's
confirmation: the part of TTFT the transfer adds. The two modes alternate request by request (the order
swapped each time), so the machine's load falls on both alike; the ratio is the number to read. The same
comparison on a GPU, with real prefills: benchmarks/gpu_disaggregated.py.
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time
from typing import TYPE_CHECKING

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.registry import temporary_registry
from benchmarks.harness.results import new_result, params_of, write_result

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

MODEL = "bench"
BLOCK_BYTES = 16 * 1024  # 2 layers x K and V x 2 heads x 32 dims x 16 tokens x float32
POOL_BLOCKS = 4096
PREFILL_SECONDS = 0.01
MODES = ("prepared", "unprepared")


def make_pool():
    from kvferry.kvcache.kv_pool import KVPool, KVPoolLayout

    return KVPool(KVPoolLayout(2, 2, 32, 16, "float32"), POOL_BLOCKS, "cpu")


def decode_side(conn: Connection, registry: str) -> None:
    """Leases on request, and the wait for each; until told to quit."""
    from kvferry.transfer import TransferEngine
    from kvferry.transfer.kv_connector import KVReceiver, pool_description

    pool = make_pool()
    engine = TransferEngine()
    engine.initialize("decode", registry, "ucx", pool=pool_description(MODEL, pool))
    receiver = KVReceiver(engine, pool, MODEL)
    handles = {}
    conn.send("ready")
    while (message := conn.recv())["cmd"] != "quit":
        if message["cmd"] == "expect":
            handles[message["request_id"]] = receiver.expect(message["request_id"], message["block_ids"])
            conn.send(handles[message["request_id"]].to_json())
        else:
            handle = handles.pop(message["request_id"])
            arrived = receiver.wait(handle)
            receiver.release(handle)
            conn.send(arrived)
    engine.close()


def request(sender, conn: Connection, request_id: str, blocks: int, prepare: bool) -> float:
    """Seconds from the prefill's end to the decode side's confirmation."""
    from kvferry.transfer.kv_connector import DestinationHandle

    conn.send({"cmd": "expect", "request_id": request_id, "block_ids": list(range(1, 1 + blocks))})
    handle = DestinationHandle.from_json(conn.recv())
    prepared = sender.prepare(handle) if prepare else None
    time.sleep(PREFILL_SECONDS)
    started = time.perf_counter()
    sender.send_blocks(request_id, list(range(POOL_BLOCKS - blocks, POOL_BLOCKS)), handle, prepared)
    seconds = time.perf_counter() - started
    conn.send({"cmd": "wait", "request_id": request_id})
    if not conn.recv():
        raise RuntimeError(f"request {request_id}: the KV did not arrive")
    return seconds


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(seconds, n=10, method="inclusive")
    return {"p50": 1e3 * statistics.median(seconds), "p90": 1e3 * cuts[8]}


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, "transfer_prepared")
    parser.add_argument("--sizes", default="65536,1048576,16777216", help="bytes per request, comma-separated")
    parser.add_argument("--requests", type=int, default=60, help="per size and mode, after 4 warm-ups each")
    args = parser.parse_args(argv)
    from kvferry.transfer import TransferEngine
    from kvferry.transfer.kv_connector import KVSender, pool_description

    registry = temporary_registry()
    context = multiprocessing.get_context("spawn")
    conn, child_conn = context.Pipe()
    child = context.Process(target=decode_side, args=(child_conn, registry), daemon=True)
    child.start()
    conn.recv()
    pool = make_pool()
    engine = TransferEngine()
    engine.initialize("prefill", registry, "ucx", pool=pool_description(MODEL, pool))
    sender = KVSender(engine, pool, MODEL)
    rows = []
    for size in [int(value) for value in args.sizes.split(",")]:
        blocks = max(1, size // BLOCK_BYTES)
        times: dict[str, list[float]] = {mode: [] for mode in MODES}
        for i in range(4 + args.requests):
            for mode in MODES[:: 1 if i % 2 == 0 else -1]:
                seconds = request(sender, conn, f"{size}-{i}-{mode}", blocks, mode == "prepared")
                if i >= 4:
                    times[mode].append(seconds)
        measured = {mode: percentiles_ms(values) for mode, values in times.items()}
        base = measured["unprepared"]
        for mode, ms in measured.items():
            rows.append({"variant": mode, "bytes": blocks * BLOCK_BYTES, "send_ms": ms,
                         "speedup_p50": base["p50"] / ms["p50"], "speedup_p90": base["p90"] / ms["p90"]})  # fmt: skip
        print(f"{blocks * BLOCK_BYTES >> 10} KiB: send after the prefill p50 / p90 {base['p50']:.3f} / {base['p90']:.3f} ms "
              f"unprepared, {measured['prepared']['p50']:.3f} / {measured['prepared']['p90']:.3f} ms prepared: "
              f"{rows[-2]['speedup_p50']:.2f}x / {rows[-2]['speedup_p90']:.2f}x", flush=True)  # fmt: skip
    conn.send({"cmd": "quit"})
    child.join(timeout=30)
    engine.close()
    path = write_result(new_result("transfer_prepared", params_of(args), rows, baseline="unprepared"), output_dir(args))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
