"""One decoder-only transformer for the Llama, Mistral, Qwen2 and Qwen3 families.

The families differ by flags from ModelConfig (q/k/v biases, per-head q/k RMSNorm, tied embeddings).
q/k/v and gate/up projections are fused into one matmul each; attention reads and writes the paged pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvferry.engine.attention_metadata import AttentionMetadata
from kvferry.engine.model_config import ModelConfig
from kvferry.engine.rope import cos_sin_cache
from kvferry.kernels import dispatch as kernels
from kvferry.kernels.dispatch import LinearWeight
from kvferry.kvcache.kv_pool import KVPool


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: LinearWeight
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o_proj: LinearWeight
    post_attention_norm: torch.Tensor
    gate_up: LinearWeight
    down: LinearWeight

    def linears(self) -> tuple[LinearWeight, ...]:
        return self.qkv, self.o_proj, self.gate_up, self.down


@dataclass
class ModelWeights:
    embed_tokens: torch.Tensor
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: LinearWeight


class CausalLM:
    def __init__(self, config: ModelConfig, weights: ModelWeights, max_positions: int) -> None:
        self.config = config
        self.weights = weights
        device = weights.embed_tokens.device
        self.cos_sin = cos_sin_cache(config.rope, config.head_dim, max_positions).to(device)
        self.scale = config.head_dim**-0.5
        self.q_size = config.num_heads * config.head_dim

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, pool: KVPool
    ) -> torch.Tensor:
        """Hidden states [tokens, hidden] after the final norm, for every input token."""
        cfg, w = self.config, self.weights
        hidden = F.embedding(input_ids, w.embed_tokens)
        residual = None
        for index, layer in enumerate(w.layers):
            normed, residual = kernels.rms_norm(hidden, layer.input_norm, cfg.rms_norm_eps, residual)
            attn = self._attention(index, layer, normed, positions, meta, pool)
            normed, residual = kernels.rms_norm(attn, layer.post_attention_norm, cfg.rms_norm_eps, residual)
            hidden = kernels.linear(kernels.silu_and_mul(kernels.linear(normed, layer.gate_up)), layer.down)
        return kernels.rms_norm(hidden, w.final_norm, cfg.rms_norm_eps, residual)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return kernels.linear(hidden, self.weights.lm_head).float()

    def _attention(
        self,
        index: int,
        layer: LayerWeights,
        x: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        pool: KVPool,
    ) -> torch.Tensor:
        cfg = self.config
        qkv = kernels.linear(x, layer.qkv, layer.qkv_bias)
        # One view and one split: q, k, v [tokens, heads, dim] (a split and three views cost twice as long, a
        # fixed few microseconds a layer on the CPU)
        heads = qkv.view(-1, cfg.num_heads + 2 * cfg.num_kv_heads, cfg.head_dim)
        q, k, v = heads.split((cfg.num_heads, cfg.num_kv_heads, cfg.num_kv_heads), dim=1)
        if cfg.qk_norm:
            q = kernels.head_rms_norm(q, layer.q_norm, cfg.rms_norm_eps)
            k = kernels.head_rms_norm(k, layer.k_norm, cfg.rms_norm_eps)
        key_cache, value_cache = pool.layer_kv(index)
        q = kernels.apply_rope_and_store_kv(q, k, v, positions, self.cos_sin, key_cache, value_cache, meta.slot_mapping)

        decodes = meta.num_decode_seqs
        if decodes == q.shape[0]:  # a decode-only batch writes its output in place: no copy kernel a layer
            out = kernels.paged_decode_attention(
                q, key_cache, value_cache, meta.decode_block_tables, meta.decode_context_lens, self.scale
            )
            return kernels.linear(out.view(-1, self.q_size), layer.o_proj)
        out = torch.empty_like(q)
        if decodes:
            out[:decodes] = kernels.paged_decode_attention(
                q[:decodes], key_cache, value_cache, meta.decode_block_tables, meta.decode_context_lens, self.scale
            )
        out[decodes:] = kernels.paged_prefill_attention(
            q[decodes:],
            key_cache,
            value_cache,
            meta.prefill_block_tables,
            meta.prefill_context_lens,
            meta.prefill_query_start_loc,
            self.scale,
        )
        return kernels.linear(out.view(-1, self.q_size), layer.o_proj)
