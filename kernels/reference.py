"""Plain torch versions of every kernel the engine calls: the CPU path, and the reference the Triton
kernels are checked against. Each follows the Hugging Face implementation's arithmetic so that float32
greedy decoding matches transformers token for token.

KV caches come in as the strided per-layer views of the pool, [num_blocks, block_size, kv_heads, dim];
nothing here assumes they are packed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm; returns (normalized, new residual). Variance is taken in float32."""
    if residual is not None:
        x = x + residual
    if x.dtype == torch.float32:  # torch's own: the same bits in one op call where this takes seven
        return F.rms_norm(x, x.shape[-1:], weight, eps), x
    # 16-bit: normalized in float32 by the same op (the bits of the five-op formula, in one call), then
    # rounded and scaled by the weight in the model's dtype, as Hugging Face's arithmetic does
    normalized = F.rms_norm(x.float(), x.shape[-1:], None, eps)
    return weight * normalized.to(x.dtype), x


def head_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of [tokens, heads, head_dim] (Qwen3's q/k norm)."""
    return rms_norm(x, weight, eps)[0]


def rotate_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary embedding of q, k [tokens, heads, head_dim] from a [max_pos, 2, head_dim] cache.
    q's and k's heads are rotated as one tensor: half the op calls, each a fixed cost on the CPU."""
    cos_sin = cos_sin_cache[positions].to(q.dtype)
    both = rotate_neox(torch.cat((q, k), dim=1), cos_sin[:, 0:1], cos_sin[:, 1:2])
    return both[:, : q.shape[1]], both[:, q.shape[1] :]


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write each token's K/V [tokens, kv_heads, dim] into pool slot `block * block_size + offset`."""
    block_size = key_cache.shape[1]
    blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
    key_cache.index_put_((blocks, offsets), key)
    value_cache.index_put_((blocks, offsets), value)


def apply_rope_and_store_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """apply_rope, then store_kv of the rotated k and of v; returns the rotated q."""
    q, k = apply_rope(q, k, positions, cos_sin_cache)
    store_kv(k, v, key_cache, value_cache, slot_mapping)
    return q


# Decode attention in these dtypes takes two matmuls in float32 (`_grouped_attention_float32`).
_SIXTEEN_BIT = (torch.bfloat16, torch.float16)


def _gather_context(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens' [length, kv_heads, dim] of one sequence, read through its block table
    (`index_select`: a row copy per block, where advanced indexing took twice as long)."""
    block_size = cache.shape[1]
    num_blocks = -(-length // block_size)
    return cache.index_select(0, block_table[:num_blocks]).flatten(0, 1)[:length]


def paged_decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence, query [batch, q_heads, dim], attending to its whole paged context.

    The context's blocks are gathered once per cache with `index_select` and read by torch's SDPA as
    strided [batch, kv_heads, len, dim] views, as transformers computes attention by default: one fused
    call for every head, where a matmul, a mask, a softmax and a matmul per kv head took twice as long for
    one sequence. One sequence reads exactly its length; a batch reads up to its longest, each sequence
    masked to its own. 16-bit inputs take `_grouped_attention_float32` instead."""
    batch, num_q_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    if batch == 1:
        length = int(context_lens[0])
        keys = _gather_context(key_cache, block_tables[0], length).transpose(0, 1)  # [kv_heads, len, dim]
        values = _gather_context(value_cache, block_tables[0], length).transpose(0, 1)
        if query.dtype in _SIXTEEN_BIT:
            return _grouped_attention_float32(query, keys[None], values[None], None, scale)
        out = F.scaled_dot_product_attention(query.transpose(0, 1), keys, values, scale=scale, enable_gqa=True)
        return out.transpose(0, 1)
    num_blocks = -(-int(context_lens.max()) // block_size)
    blocks = block_tables[:, :num_blocks].reshape(-1)
    length = num_blocks * block_size
    keys = key_cache.index_select(0, blocks).view(batch, length, num_kv_heads, head_dim).transpose(1, 2)
    values = value_cache.index_select(0, blocks).view(batch, length, num_kv_heads, head_dim).transpose(1, 2)
    within = torch.arange(length, device=query.device)[None, :] < context_lens[:, None]
    if query.dtype in _SIXTEEN_BIT:
        return _grouped_attention_float32(query, keys, values, within, scale)
    out = F.scaled_dot_product_attention(query.unsqueeze(2), keys, values, attn_mask=within[:, None, None, :],
                                         scale=scale, enable_gqa=True)  # fmt: skip
    return out.view(batch, num_q_heads, head_dim)


def _grouped_attention_float32(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, within: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """One query token per sequence, query [batch, q_heads, dim], over keys and values [batch, kv_heads, len,
    dim] (positions where `within` [batch, len] is False masked), as two matmuls and a softmax in float32; the
    output in the query's dtype.

    For 16-bit inputs on the CPU: torch's SDPA took 1.35 ms for 16 bfloat16 sequences of 160 tokens (9 heads
    over 3) where this takes 0.24 ms, with the same largest error against float64 (a probe on two cores), and
    90 us against about 45 for one sequence. Each kv head's query heads are one matrix (q head h reads kv head
    h // group, as transformers' repeat_kv has it)."""
    batch, num_q_heads, head_dim = query.shape
    num_kv_heads = keys.shape[1]
    grouped = query.reshape(batch, num_kv_heads, num_q_heads // num_kv_heads, head_dim).float()
    # Converted into packed copies: `.float()` keeps the gathered views' strides, and matmul then copied
    # them once more to pack them (1.78 -> 0.75 ms a layer for 16 sequences of 192 tokens, one thread).
    keys = keys.to(torch.float32, memory_format=torch.contiguous_format)
    values = values.to(torch.float32, memory_format=torch.contiguous_format)
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).mul_(scale)
    if within is not None:
        scores.masked_fill_(~within[:, None, None, :], float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), values)
    return out.reshape(batch, num_q_heads, head_dim).to(query.dtype)


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Varlen batch of new tokens, query [tokens, q_heads, dim]: each sequence's new tokens attend to its
    cached prefix in full and to each other causally. Their K/V must already be stored in the pool.

    torch's SDPA per sequence, as transformers computes attention by default: its fused CPU kernel skips
    the causal half and never holds a [heads, new, len] score matrix, which the matmul-softmax-matmul it
    replaced did for every layer of a 512-token prompt. A cached prefix makes the mask rectangular: new
    token i sees the first `prefix + i + 1` positions."""
    num_q_heads, head_dim = query.shape[1], query.shape[2]
    output = torch.empty_like(query)
    starts, lens = query_start_loc.tolist(), context_lens.tolist()
    for seq, context_len in enumerate(lens):
        begin, end = starts[seq], starts[seq + 1]
        num_new = end - begin
        keys = _gather_context(key_cache, block_tables[seq], context_len).transpose(0, 1)  # [kv_heads, len, dim]
        values = _gather_context(value_cache, block_tables[seq], context_len).transpose(0, 1)
        q = query[begin:end].transpose(0, 1)  # [q_heads, new, dim]
        first_new = context_len - num_new
        mask = None
        if first_new:
            rows = torch.arange(num_new, device=query.device)[:, None] + first_new
            mask = torch.arange(context_len, device=query.device)[None, :] <= rows
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=mask is None, scale=scale,
                                             enable_gqa=True)  # fmt: skip
        output[begin:end] = out.transpose(0, 1).reshape(num_new, num_q_heads, head_dim)
    return output
