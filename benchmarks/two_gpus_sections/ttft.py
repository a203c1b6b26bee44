"""The ttft section: the transfer's share of TTFT, one request at a time; this process prefills on the first
device, a child decodes on the second (benchmarks/gpu_disaggregated.py's requests), beside the prefill
engine serving the same requests whole."""

from __future__ import annotations

import argparse
import gc
import random
from pathlib import Path

import torch

from benchmarks.gpu_disaggregated import (
    DECODE_PEER,
    MODEL_NAME,
    colocated_request,
    disaggregated_request,
    start_decode_process,
    summarize,
)
from benchmarks.harness.registry import temporary_registry
from benchmarks.two_gpus_sections import WARM_RUNS
from kvferry.engine.engine_args import EngineArgs


def engine_args(args: argparse.Namespace, device: str) -> EngineArgs:
    if args.quick:
        return EngineArgs(dtype="float32", device=device, max_model_len=512, max_num_seqs=8, max_num_batched_tokens=512,
                          num_kv_blocks=256, enable_prefix_caching=False)  # fmt: skip
    longest = max(int(n) for n in args.lengths.split(","))
    return EngineArgs(dtype="bfloat16", device=device, max_model_len=longest + 256, max_num_seqs=8,
                      max_num_batched_tokens=longest, num_kv_blocks=2 * (longest + 256) // 16 + 2,
                      enable_prefix_caching=False)  # fmt: skip


def ttft(args: argparse.Namespace, model: Path) -> dict[str, object]:
    from kvferry.engine import LLMEngine
    from kvferry.transfer import TransferEngine
    from kvferry.transfer.kv_connector import KVSender, pool_description

    prefill_device, decode_device = args.devices
    registry = temporary_registry()
    prefill = LLMEngine(model, engine_args(args, prefill_device))
    transfer = TransferEngine()
    transfer.initialize("prefill-ttft", registry, "ucx", pool=pool_description(MODEL_NAME, prefill.pool))
    sender = KVSender(transfer, prefill.pool, MODEL_NAME)
    conn, child = start_decode_process(str(model), registry, engine_args(args, decode_device))
    result: dict[str, object] = {"decode_pool_blocks": conn.recv()["pool_blocks"], "output_len": args.ttft_output_len,
                                 "requests_per_length": args.requests, "lengths": {}}  # fmt: skip
    try:
        sender.handshake(DECODE_PEER)
        rng = random.Random(args.seed)
        vocab = prefill.model_config.vocab_size
        for length in [int(n) for n in args.lengths.split(",")]:
            prompts = [
                [rng.randrange(vocab) for _ in range(length)] for _ in range(args.requests + WARM_RUNS)
            ]
            for i, prompt in enumerate(
                prompts[:WARM_RUNS]
            ):  # compiles this length's shapes in both processes
                colocated_request(prefill, f"warm-c{length}-{i}", prompt, 4)
                disaggregated_request(prefill, sender, conn, f"warm-d{length}-{i}", prompt, 4, prepare=True)
            timed_prompts = prompts[WARM_RUNS:]
            colocated = [
                colocated_request(prefill, f"c{length}-{i}", p, args.ttft_output_len)
                for i, p in enumerate(timed_prompts)
            ]
            disaggregated = [disaggregated_request(prefill, sender, conn, f"d{length}-{i}", p, args.ttft_output_len,
                                                   prepare=True)
                             for i, p in enumerate(timed_prompts)]  # fmt: skip
            entry = {"colocated": summarize(colocated), "disaggregated": summarize(disaggregated),
                     "kv_bytes_per_request": disaggregated[0]["kv_bytes"]}  # fmt: skip
            result["lengths"][str(length)] = entry  # type: ignore[index]
            d, c = entry["disaggregated"], entry["colocated"]
            print(f"{length}-token prompts, P on {prefill_device}, D on {decode_device}: TTFT p50 colocated "
                  f"{c['ttft_ms']['p50']:.1f} ms, disaggregated {d['ttft_ms']['p50']:.1f} ms (transfer "
                  f"{d['transfer_ms']['p50']:.2f} ms = {d['transfer_share']['p50']:.1%} of TTFT, p99 "
                  f"{d['transfer_share']['p99']:.1%}); TPOT p50 {c['tpot_ms']['p50']:.2f} vs {d['tpot_ms']['p50']:.2f} ms",
                  flush=True)  # fmt: skip
    finally:
        conn.send({"cmd": "quit"})
        child.join(timeout=60)
        transfer.close()
        del prefill, sender
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the serving section's nodes may share this GPU
    return result
