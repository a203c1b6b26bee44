"""What one forward pass needs to find each token's place in the paged KV pool."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Tokens are ordered decodes first (one token each), then prefill chunks (varlen)."""

    slot_mapping: torch.Tensor  # [tokens] pool slot each new token's K/V is written to
    num_decode_seqs: int
    decode_block_tables: torch.Tensor  # [decodes, max_blocks]
    decode_context_lens: torch.Tensor  # [decodes]
    prefill_block_tables: torch.Tensor  # [prefills, max_blocks]
    prefill_context_lens: torch.Tensor  # [prefills] tokens cached before + new in this step
    prefill_query_start_loc: torch.Tensor  # [prefills + 1] offsets into the prefill tokens
