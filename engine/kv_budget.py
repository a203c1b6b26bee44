"""How many KV blocks the pool gets: fixed by the arguments, or measured on the GPU after the weights load.

On CUDA the pool takes what is left of `gpu_memory_fraction` of the card once the weights are resident and
the largest forward pass has been run once (its activation peak is measured, not guessed). The profile
pass also compiles the prefill kernels, so the first request does not pay for that.
"""

from __future__ import annotations

import torch

from kvferry.engine.attention_metadata import AttentionMetadata
from kvferry.engine.engine_args import EngineArgs
from kvferry.engine.model import CausalLM
from kvferry.kvcache.allocator import NULL_BLOCK_ID
from kvferry.kvcache.kv_pool import KVPool, KVPoolLayout

CPU_KV_CACHE_BYTES = 1 << 30
# Kept free beyond the measured peak: the decode CUDA graphs' private memory (logits of the largest batch
# and their activations) and the allocator's fragmentation.
GRAPH_AND_FRAGMENTATION_RESERVE = 1 << 30


def num_kv_blocks(args: EngineArgs, model: CausalLM, layout: KVPoolLayout, device: torch.device, max_model_len: int) -> int:
    if args.num_kv_blocks is not None:
        return args.num_kv_blocks
    if args.kv_cache_bytes is not None:
        return KVPool.blocks_for_budget(layout, args.kv_cache_bytes)
    if device.type != "cuda":
        return KVPool.blocks_for_budget(layout, CPU_KV_CACHE_BYTES)
    return KVPool.blocks_for_budget(layout, cuda_kv_cache_bytes(args, model, layout, device, max_model_len))


def cuda_kv_cache_bytes(
    args: EngineArgs, model: CausalLM, layout: KVPoolLayout, device: torch.device, max_model_len: int
) -> int:
    """fraction x total memory, minus what is in use now (weights, other processes), minus the peak."""
    peak = profile_activation_bytes(model, layout, device, min(args.max_num_batched_tokens, max_model_len - 1),
                                    args.max_num_seqs)  # fmt: skip
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    budget = int(args.gpu_memory_fraction * total) - (total - free) - peak - GRAPH_AND_FRAGMENTATION_RESERVE
    if budget <= 0:
        raise ValueError(
            f"gpu_memory_fraction={args.gpu_memory_fraction} leaves no room for a KV pool: "
            f"{(total - free) / 2**30:.1f} GiB in use of {total / 2**30:.1f} GiB, activation peak "
            f"{peak / 2**30:.2f} GiB; raise the fraction or lower max_num_batched_tokens"
        )
    return budget


@torch.inference_mode()
def profile_activation_bytes(
    model: CausalLM, layout: KVPoolLayout, device: torch.device, num_tokens: int, num_sampled_rows: int
) -> int:
    """Peak bytes one prefill chunk of `num_tokens` allocates beyond what is resident, with logits for
    `num_sampled_rows` rows, measured in a throwaway pool just large enough for it."""
    blocks = -(-num_tokens // layout.block_size)
    pool = KVPool(layout, blocks + 1, device)
    positions = torch.arange(num_tokens, device=device)
    table = torch.arange(1, blocks + 1, device=device)[None, :]
    meta = AttentionMetadata(
        slot_mapping=positions + layout.block_size * (NULL_BLOCK_ID + 1),
        num_decode_seqs=0,
        decode_block_tables=torch.zeros(0, 0, dtype=torch.long, device=device),
        decode_context_lens=torch.zeros(0, dtype=torch.long, device=device),
        prefill_block_tables=table,
        prefill_context_lens=torch.tensor([num_tokens], device=device),
        prefill_query_start_loc=torch.tensor([0, num_tokens], device=device),
    )
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    hidden = model.forward(torch.zeros(num_tokens, dtype=torch.long, device=device), positions, meta, pool)
    rows = torch.arange(min(num_sampled_rows, num_tokens), device=device)
    model.logits(hidden[rows]).softmax(dim=-1)  # the sampler's float32 copies of the logits
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before
