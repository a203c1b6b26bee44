"""Disaggregated against colocated serving on one GPU, at engine level: TTFT, TPOT and the transfer's share.

    python -m benchmarks.gpu_disaggregated --model DIR   # on a CUDA machine, ucxx installed

Two processes share the card, each with its own KV pool: this one prefills (LLMEngine + TransferEngine +
KVSender), a child decodes (LLMEngine + TransferEngine + KVReceiver), and the prompt's KV moves between
their pools through UCX's CUDA transports, as tests/integration/test_disaggregated_engine.py does within
one process. Requests run one at a time, so each time is the request's own: TTFT is submission to the
decode process holding the first token with the prompt's KV in place (prefill, reservation round trip,
transfer, activation); TPOT is the decode process's time per further token. The colocated numbers come
from the prefill process's engine serving the same requests whole. Each length's pool-to-pool rate (its KV
over the transfer's time, at the transfer's p50 / p90 / p99) stands beside a device-to-device copy of the same
bytes timed in the same run, bytes counted once.

Disaggregated requests go as a prefill node serves them: blocks reserved on the decode side first (the
router's order), the write prepared before the prefill (KVSender.prepare), its data sent once the KV exists.
Interleaved with them, the same requests with the write requested only after the prefill
(`disaggregated_unprepared`, the code before prepared writes), so that the two compare within one run.
"""

from __future__ import annotations

import gc
import multiprocessing
import random
import statistics
import sys
import time
from typing import TYPE_CHECKING

from benchmarks.harness.cli import benchmark_parser, output_dir
from benchmarks.harness.registry import temporary_registry
from benchmarks.harness.results import new_result, params_of, write_result

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

    from kvferry.engine.engine_args import EngineArgs

MODEL_NAME = "llama-8b-shape"
PROMPT_LENGTHS = (1024, 8192)
MAX_MODEL_LEN = 8192 + 256
DECODE_PEER = "decode-gpu"  # the decode process's name in the registry


def engine_args(fraction: float) -> EngineArgs:
    from kvferry.engine.engine_args import EngineArgs

    return EngineArgs(dtype="bfloat16", max_model_len=MAX_MODEL_LEN, max_num_seqs=8, max_num_batched_tokens=8192,
                      gpu_memory_fraction=fraction, enable_prefix_caching=False)  # fmt: skip


def decode_process(conn, model_dir: str, registry: str, args: EngineArgs) -> None:
    """The decode side: reserve blocks, wait for the KV, activate, decode to the end; times on the shared
    monotonic clock."""
    from kvferry.engine import LLMEngine, SamplingParams
    from kvferry.transfer import TransferEngine
    from kvferry.transfer.kv_connector import KVReceiver, pool_description

    engine = LLMEngine(model_dir, args)  # makes its device current before UCX starts below
    transfer = TransferEngine()
    transfer.initialize(DECODE_PEER, registry, "ucx", pool=pool_description(MODEL_NAME, engine.pool))
    receiver = KVReceiver(transfer, engine.pool, MODEL_NAME, lease_seconds=60)
    handles = {}
    conn.send({"ready": True, "pool_blocks": engine.pool.num_blocks})
    while True:
        message = conn.recv()
        if message["cmd"] == "quit":
            break
        request_id = message["request_id"]
        if message["cmd"] == "reserve":
            params = SamplingParams(temperature=0, max_tokens=message["max_tokens"], ignore_eos=True)
            reservation = engine.reserve(request_id, {"prompt_token_ids": message["prompt"]}, params)
            handles[request_id] = receiver.expect(request_id, reservation.block_ids, reservation.first_block)
            conn.send({"handle": handles[request_id].to_json()})
            continue
        handle = handles.pop(request_id)
        arrived = receiver.wait(handle)
        receiver.release(handle)
        # The decode node computes the last prompt position over the arrived KV and samples token 1 itself.
        engine.activate(request_id)
        first_token_at = None
        tokens = 0
        while engine.has_unfinished_requests():
            for output in engine.step():
                tokens = len(output.outputs[0].token_ids)
                first_token_at = first_token_at or time.monotonic()
        conn.send(
            {
                "arrived": arrived,
                "first_token_at": first_token_at,
                "done_at": time.monotonic(),
                "tokens": tokens,
            }
        )
    transfer.close()


def start_decode_process(model_dir: str, registry: str, args: EngineArgs) -> tuple[Connection, BaseProcess]:
    """decode_process in a child, and the pipe that drives it. Spawned, not forked: a fork would inherit
    this process's CUDA context, which CUDA does not allow."""
    context = multiprocessing.get_context("spawn")
    conn, child_conn = context.Pipe()
    child = context.Process(target=decode_process, args=(child_conn, model_dir, registry, args), daemon=True)
    child.start()
    return conn, child


def _prefill(engine, request_id: str, prompt: list[int]):
    from kvferry.engine import SamplingParams

    engine.add_request(
        request_id, {"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=1), hold_kv=True
    )
    while True:
        for output in engine.step():
            if output.finished:
                return output


class GcClock:
    """Time this process spends in garbage collection, for telling a collector pause from a slow transfer."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._started = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, _info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.total_s += time.perf_counter() - self._started


GC_CLOCK = GcClock()


def disaggregated_request(
    engine, sender, conn, request_id: str, prompt: list[int], output_len: int, prepare: bool
) -> dict[str, float]:
    from kvferry.transfer.kv_connector import DestinationHandle, coalesce_block_runs

    started = time.monotonic()
    conn.send({"cmd": "reserve", "request_id": request_id, "prompt": prompt, "max_tokens": output_len})
    handle = DestinationHandle.from_json(conn.recv()["handle"])
    reserved = time.monotonic()
    prepared = sender.prepare(handle) if prepare else None
    first = _prefill(engine, request_id, prompt)
    prefilled = time.monotonic()
    gc_before = GC_CLOCK.total_s
    sent = sender.send_blocks(request_id, first.kv_block_ids, handle, prepared)
    transferred = time.monotonic()
    runs = coalesce_block_runs(first.kv_block_ids[handle.first_block :], handle.block_ids)
    engine.release_kv(request_id)
    conn.send({"cmd": "activate", "request_id": request_id})
    decoded = conn.recv()
    assert decoded["arrived"] and decoded["tokens"] == output_len, decoded
    ttft = decoded["first_token_at"] - started
    return {"ttft_ms": 1e3 * ttft, "tpot_ms": 1e3 * (decoded["done_at"] - decoded["first_token_at"]) / (output_len - 1),
            "reserve_ms": 1e3 * (reserved - started), "prefill_ms": 1e3 * (prefilled - reserved),
            "transfer_ms": 1e3 * (transferred - prefilled), "transfer_share": (transferred - prefilled) / ttft,
            "kv_bytes": sent, "transfer_gc_ms": 1e3 * (GC_CLOCK.total_s - gc_before), "runs": len(runs),
            "prepared": prepared.outcome if prepared is not None else "no",
            "src_first_block": runs[0][0], "dst_first_block": runs[0][1]}  # fmt: skip


def colocated_request(engine, request_id: str, prompt: list[int], output_len: int) -> dict[str, float]:
    from kvferry.engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    started = time.monotonic()
    engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
    first_at = None
    while engine.has_unfinished_requests():
        if engine.step():
            first_at = first_at or time.monotonic()
    done = time.monotonic()
    return {"ttft_ms": 1e3 * (first_at - started), "tpot_ms": 1e3 * (done - first_at) / (output_len - 1)}


def percentiles(values: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": statistics.median(values), "p90": cuts[89], "p99": cuts[98]}


def pool_to_pool(kv_bytes: int, samples: list[dict[str, float]]) -> dict[str, float]:
    """The transfer's rate (the request's KV over its transfer time) beside a device-to-device copy of as many
    bytes, measured now in this process, bytes counted once as for the transfer."""
    from benchmarks.gpu_roofline import copy_bandwidth

    copy_gb_s = copy_bandwidth(kv_bytes) / 2 / 1e9
    transfer_ms = percentiles([s["transfer_ms"] for s in samples])
    rates = {f"{key}_gb_s": kv_bytes / (ms / 1e3) / 1e9 for key, ms in transfer_ms.items()}
    return {
        "copy_gb_s": copy_gb_s,
        **rates,
        **{f"{key}_share_of_copy": rates[f"{key}_gb_s"] / copy_gb_s for key in transfer_ms},
    }


# Per transfer, not summarized: "prepared" is "sent" (the data went as prepared), "withdrawn" (the source
# split a prepared run: an ordinary write followed) or "no" (unprepared).
NOT_TIMES = ("kv_bytes", "runs", "src_first_block", "dst_first_block", "prepared")


def summarize(samples: list[dict[str, float]]) -> dict[str, object]:
    return {key: percentiles([s[key] for s in samples]) for key in samples[0] if key not in NOT_TIMES}


def main(argv: list[str] | None = None) -> int:
    parser = benchmark_parser(__doc__, "gpu_disaggregated")
    parser.add_argument("--model", required=True)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument(
        "--lengths", default=",".join(map(str, PROMPT_LENGTHS)), help="prompt lengths, comma-separated"
    )
    args = parser.parse_args(argv)
    from kvferry.engine import LLMEngine
    from kvferry.transfer import TransferEngine
    from kvferry.transfer.kv_connector import KVSender, pool_description

    registry = temporary_registry()
    prefill = LLMEngine(
        args.model, engine_args(0.42)
    )  # first on the card: the decode process's share counts this one's
    transfer = TransferEngine()
    transfer.initialize("prefill-gpu", registry, "ucx", pool=pool_description(MODEL_NAME, prefill.pool))
    sender = KVSender(transfer, prefill.pool, MODEL_NAME)
    conn, child = start_decode_process(args.model, registry, engine_args(0.88))
    ready = conn.recv()
    sender.handshake(DECODE_PEER)
    pools = {"prefill_pool_blocks": prefill.pool.num_blocks, "decode_pool_blocks": ready["pool_blocks"]}
    rows = []
    vocab = prefill.model_config.vocab_size
    rng = random.Random(0)
    for length in [int(n) for n in args.lengths.split(",")]:
        prompts = [[rng.randrange(vocab) for _ in range(length)] for _ in range(args.requests + 2)]
        warm, timed = prompts[:2], prompts[2:]
        for i, prompt in enumerate(warm):  # compiles this length's prefill shapes in both processes
            colocated_request(prefill, f"warm-c{length}-{i}", prompt, 4)
            for prepare in (True, False):
                disaggregated_request(prefill, sender, conn, f"warm-d{length}-{i}-{prepare}", prompt, 4, prepare)
        colocated = [
            colocated_request(prefill, f"c{length}-{i}", p, args.output_len) for i, p in enumerate(timed)
        ]
        modes: dict[str, list[dict[str, float]]] = {"disaggregated": [], "disaggregated_unprepared": []}
        for i, p in enumerate(timed):  # interleaved, the order swapped on odd requests
            for mode in list(modes)[:: 1 if i % 2 == 0 else -1]:
                modes[mode].append(disaggregated_request(prefill, sender, conn, f"{mode}{length}-{i}", p,
                                                         args.output_len, mode == "disaggregated"))  # fmt: skip
        kv_bytes = modes["disaggregated"][0]["kv_bytes"]
        entry = {"prompt_tokens": length, "colocated": summarize(colocated), "kv_bytes_per_request": kv_bytes}
        for mode, samples in modes.items():
            entry[mode] = summarize(samples)
            entry[f"{mode}_pool_to_pool"] = pool_to_pool(kv_bytes, samples)
            entry[f"{mode}_transfers"] = [{key: s[key] for key in ("transfer_ms", "transfer_gc_ms", *NOT_TIMES[1:])}
                                          for s in samples]  # fmt: skip
        rows.append(entry)
        c = entry["colocated"]
        for mode in modes:
            d, rate = entry[mode], entry[f"{mode}_pool_to_pool"]
            print(f"{length}-token prompts: TTFT p50 colocated {c['ttft_ms']['p50']:.1f} ms, {mode} "
                  f"{d['ttft_ms']['p50']:.1f} ms (transfer {d['transfer_ms']['p50']:.2f} / {d['transfer_ms']['p90']:.2f} "
                  f"ms p50 / p90 = {d['transfer_share']['p50']:.1%} of TTFT, p90 {d['transfer_share']['p90']:.1%}, p99 "
                  f"{d['transfer_share']['p99']:.1%}); TPOT p50 {c['tpot_ms']['p50']:.2f} vs {d['tpot_ms']['p50']:.2f} ms; "
                  f"pool to pool {rate['p50_gb_s']:.0f} GB/s at p50 = {rate['p50_share_of_copy']:.0%} of a "
                  f"{rate['copy_gb_s']:.0f} GB/s device copy of the same bytes", flush=True)  # fmt: skip
        # Written after every length, so that a run cut off by its time limit keeps the lengths it measured.
        write_result(new_result("gpu_disaggregated", params_of(args), rows, summary=pools), output_dir(args))
    conn.send({"cmd": "quit"})
    child.join(timeout=30)
    transfer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
