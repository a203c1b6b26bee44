"""The TTFT part: the share of TTFT that shipping a prompt's KV takes. TTFT is kvferry's engine prefilling
the prompt and producing one token; the transfer is kvferry's TransferEngine moving that prompt's KV blocks
between two processes, coalesced as the KV connector does."""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness.environment import cached_model, long_context_copy
from benchmarks.transfer_peers.machine import loadavg
from benchmarks.transfer_peers.measurement import Measurement
from benchmarks.transfer_peers.pair import Pair, Registry
from benchmarks.transfer_peers.workload import (
    SLOT_SEED,
    Batch,
    digest,
    expected_image,
    size_label,
    source_bytes,
)

# TTFT part: the `small` checkpoint in float32 (12 layers, 4 KV heads, head dim 64: 24 KiB of KV per token).
TTFT_TOKENS = (128, 512, 2048, 8192)
KV_BLOCK_TOKENS = 16
TTFT_MAX_MODEL_LEN = 8704


def kv_bytes_per_token(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 4  # float32


def measure_ttft(
    model_dir: Path, tokens: Sequence[int], repeats: int, max_seconds: float
) -> dict[int, dict[str, Any]]:
    """Prefill + first token for fresh random prompts (no prefix-cache hits). A length runs `repeats`
    times if its first run took under 10 s, else once; a length is skipped when the shorter ones
    predict (quadratically) that it would take longer than `max_seconds`."""
    from kvferry.engine import LLM, SamplingParams

    config = json.loads((model_dir / "config.json").read_text())
    blocks = math.ceil(TTFT_MAX_MODEL_LEN / KV_BLOCK_TOKENS) + 8
    llm = LLM(model_dir, dtype="float32", max_model_len=TTFT_MAX_MODEL_LEN, num_kv_blocks=blocks)
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)

    def once(n: int) -> float:
        prompt = {"prompt_token_ids": rng.integers(0, config["vocab_size"], n).tolist()}
        start = time.perf_counter()
        outputs = llm.generate([prompt], [params])
        elapsed = time.perf_counter() - start
        assert len(outputs[0].outputs[0].token_ids) == 1
        return elapsed

    once(64)  # warm-up: first-call allocations and kernel selection
    results: dict[int, dict[str, Any]] = {}
    previous: tuple[int, float] | None = None
    for n in tokens:
        predicted = previous[1] * (n / previous[0]) ** 2 if previous else 0.0
        if predicted > max_seconds:
            results[n] = {"skipped": f"predicted {predicted:.0f} s > --ttft-max-seconds {max_seconds:.0f}"}
            continue
        times = [once(n)]
        times += [once(n) for _ in range(repeats - 1 if times[0] < 10 else 0)]
        results[n] = {"ttft_ms": round(float(np.median(times)) * 1e3, 1), "ttft_runs_ms": [round(t * 1e3, 1) for t in times],
                      "load_after": loadavg()}  # fmt: skip
        previous = (n, float(np.median(times)))
        print(f"  TTFT {n:5d} tokens: {results[n]['ttft_ms']:9.1f} ms ({len(times)} run(s))", flush=True)
    return results


def ttft_part(args: argparse.Namespace, registry: Registry, logs: Path) -> dict[str, Any]:
    model_dir, model_note = long_context_copy(cached_model("llama", "small"), TTFT_MAX_MODEL_LEN)
    per_token = kv_bytes_per_token(model_dir)
    block_bytes = per_token * KV_BLOCK_TOKENS
    load_before = loadavg()
    ttft = measure_ttft(model_dir, args.ttft_tokens, args.ttft_repeats, args.ttft_max_seconds)
    counts = {n: math.ceil(n / KV_BLOCK_TOKENS) for n in args.ttft_tokens}
    runs = {n: (Batch(block_bytes, c, None), Batch(block_bytes, c, SLOT_SEED)) for n, c in counts.items()}
    source = source_bytes(block_bytes * max(counts.values()))
    pair = Pair.start("kvferry", block_bytes * max(counts.values()), registry.url, logs)

    def measured(batch: Batch) -> Measurement:
        expected = digest(expected_image(source, batch), batch.nbytes)
        return pair.measure(batch, args.runs, args.warmup, expected, coalesce=True)

    rows = []
    try:
        for n in args.ttft_tokens:
            coalesced, fragmented = runs[n]
            m, f = measured(coalesced), measured(fragmented)
            rows.append(ttft_row(n, coalesced, m, f, ttft[n]))
            print(f"  transfer {n:5d} tokens ({size_label(coalesced.nbytes)}): {m.p50_ms:8.2f} ms coalesced, "
                  f"{f.p50_ms:8.2f} ms as {coalesced.count} scattered blocks", flush=True)  # fmt: skip
    finally:
        pair.stop()
    return {"model": f"llama-small ({model_dir.name}), float32, block_size {KV_BLOCK_TOKENS}", "model_note": model_note,
            "kv_bytes_per_token": per_token, "kv_bytes_per_block": block_bytes, "rows": rows,
            "load_before": load_before, "load_after": loadavg()}  # fmt: skip


def ttft_row(
    tokens: int, batch: Batch, coalesced: Measurement, fragmented: Measurement, ttft: dict[str, Any]
) -> dict[str, Any]:
    ttft_ms = ttft.get("ttft_ms")
    return {
        "prompt_tokens": tokens,
        "kv_blocks": batch.count,
        "kv_bytes": batch.nbytes,
        "ttft_ms": ttft_ms,
        "ttft_note": ttft.get("skipped"),
        "transfer_ms": coalesced.p50_ms,
        "transfer_p99_ms": coalesced.p99_ms,
        "transfer_gbps": coalesced.gbps,
        "transfer_share_of_ttft": None if ttft_ms is None else round(coalesced.p50_ms / ttft_ms, 4),
        # The same blocks landing in scattered destination blocks: one message per 384 KiB block.
        "transfer_scattered_ms": fragmented.p50_ms,
        "transfer_scattered_share_of_ttft": None
        if ttft_ms is None
        else round(fragmented.p50_ms / ttft_ms, 4),
        "verified": coalesced.verified and fragmented.verified,
    }
