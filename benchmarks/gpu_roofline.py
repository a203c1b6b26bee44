"""The two ceilings of one GPU (copy bandwidth, bf16 matmul rate), measured, and the serving roofline they
give for a model: the least time any engine needs for a prefill and for each decode step.

A decode step must read every weight it multiplies by (the embedding table only by rows, so it is left
out) plus the KV of every context token in the batch, and do 2 FLOPs per weight per sequence; a prefill
must do 2 FLOPs per weight per prompt token plus causal attention. Each takes the larger of its
bytes-over-bandwidth and FLOPs-over-matmul-rate times.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from kvferry.kernels.fp8_weight import Fp8Weight

COPY_BYTES = 4 << 30
MATMUL_SIZE = 8192


def _median_ms(run, repeats: int = 10, warmup: int = 3) -> float:
    times = []
    for index in range(warmup + repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        if index >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth(size_bytes: int = COPY_BYTES) -> float:
    """Bytes per second of a device-to-device copy of `size_bytes`, counting bytes read and bytes written."""
    seconds = _copy_seconds(size_bytes)
    torch.cuda.empty_cache()  # a caller short of memory (two engines on one card) gets the copy's back
    return 2 * size_bytes / seconds


def _copy_seconds(size_bytes: int) -> float:
    src = torch.randint(0, 255, (size_bytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return _median_ms(lambda: dst.copy_(src)) / 1e3


def matmul_rate() -> float:
    """bf16 FLOP/s of one large matrix product on random data (zeros run faster than real data)."""
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=torch.bfloat16, device="cuda")
    seconds = _median_ms(lambda: a @ b) / 1e3
    return 2 * MATMUL_SIZE**3 / seconds


@dataclass(frozen=True)
class ModelCost:
    weight_bytes: int  # read by one decode step
    matmul_params: int  # weights a token multiplies by
    kv_bytes_per_token: int
    attention_width: int  # layers x query heads x head dim


@dataclass(frozen=True)
class Roofline:
    bandwidth: float  # bytes/s
    flops: float  # FLOP/s
    model: ModelCost

    def decode_step_seconds(self, batch: int, total_context: int) -> float:
        """One step for `batch` sequences holding `total_context` tokens of KV between them."""
        m = self.model
        read = m.weight_bytes + total_context * m.kv_bytes_per_token
        work = 2 * batch * m.matmul_params + 4 * total_context * m.attention_width
        return max(read / self.bandwidth, work / self.flops)

    def prefill_seconds(self, batch: int, prompt_len: int) -> float:
        m = self.model
        work = 2 * batch * prompt_len * m.matmul_params + 2 * batch * prompt_len**2 * m.attention_width
        return max(work / self.flops, m.weight_bytes / self.bandwidth)

    def case(self, prompt_len: int, output_len: int, concurrency: int) -> tuple[float, float]:
        """(output tokens/s, mean TPOT in seconds) of `concurrency` requests served together: one prefill,
        then output_len - 1 decode steps over a growing context."""
        steps = [
            self.decode_step_seconds(concurrency, concurrency * (prompt_len + k))
            for k in range(1, output_len)
        ]
        total = self.prefill_seconds(concurrency, prompt_len) + sum(steps)
        return concurrency * output_len / total, sum(steps) / max(1, len(steps))


def _tensors(weight: torch.Tensor | Fp8Weight) -> list[torch.Tensor]:
    """What a weight reads from memory: an FP8 weight's bytes and its scales."""
    return [weight.data, weight.scale] if isinstance(weight, Fp8Weight) else [weight]


def model_cost(engine) -> ModelCost:
    """From a loaded LLMEngine: the bytes its weights (16-bit or FP8) and its KV pool really take."""
    weights, cfg = engine.runner.model.weights, engine.model_config
    matmuls = [weights.lm_head] + [linear for layer in weights.layers for linear in layer.linears()]
    small = [weights.final_norm] + [
        t for layer in weights.layers for t in (layer.input_norm, layer.post_attention_norm)
    ]
    read = [t for weight in matmuls for t in _tensors(weight)] + small
    nbytes = sum(t.numel() * t.element_size() for t in read)
    layout = engine.pool_layout
    return ModelCost(
        weight_bytes=nbytes,
        matmul_params=sum(_tensors(weight)[0].numel() for weight in matmuls),
        kv_bytes_per_token=layout.bytes_per_block() // layout.block_size,
        attention_width=cfg.num_layers * cfg.num_heads * cfg.head_dim,
    )
