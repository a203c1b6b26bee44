"""Turns a scheduled batch into tensors, runs the model over the paged pool, and samples.

Decode-only batches replay a CUDA graph when the runner has them (engine/cuda_graphs.py); every other batch,
and every batch on the CPU, runs the model eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvferry.engine.attention_metadata import AttentionMetadata
from kvferry.engine.cuda_graphs import CONTEXT_LEN, POSITION, SLOT, TOKEN, DecodeGraphs
from kvferry.engine.model import CausalLM
from kvferry.engine.sampler import SamplerOutput, sample
from kvferry.engine.scheduler import ScheduledBatch
from kvferry.engine.sequence import Sequence
from kvferry.kvcache.allocator import NULL_BLOCK_ID
from kvferry.kvcache.kv_pool import KVPool


@dataclass
class PreparedBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: torch.Tensor
    sampling_seqs: list[Sequence]


class ModelRunner:
    def __init__(
        self, model: CausalLM, pool: KVPool, device: torch.device, graphs: DecodeGraphs | None = None
    ) -> None:
        self.model = model
        self.pool = pool
        self.device = device
        self.block_size = pool.layout.block_size
        self.graphs = graphs

    def _block_table(self, seqs: list[Sequence]) -> torch.Tensor:
        width = max((len(s.block_ids) for s in seqs), default=0)
        rows = [s.block_ids + [NULL_BLOCK_ID] * (width - len(s.block_ids)) for s in seqs]
        return torch.tensor(rows, dtype=torch.long).reshape(len(seqs), width)

    def prepare(self, batch: ScheduledBatch) -> PreparedBatch:
        """Inputs with single-token sequences first, and the rows to sample from, in batch order, for the
        sequences whose computed tokens reach their end this step (a prefill chunk mid-prompt samples not)."""
        order = sorted(range(len(batch.seqs)), key=lambda i: batch.num_new_tokens[i] != 1)
        decodes = [i for i in order if batch.num_new_tokens[i] == 1]
        prefills = [i for i in order if batch.num_new_tokens[i] != 1]
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last_row: dict[int, int] = {}
        query_start = [0]
        for i in order:
            seq, count = batch.seqs[i], batch.num_new_tokens[i]
            start = seq.num_computed_tokens
            span = range(start, start + count)
            input_ids.extend(seq.token_ids[start : start + count])
            positions.extend(span)
            slots.extend(seq.block_ids[p // self.block_size] * self.block_size + p % self.block_size for p in span)
            last_row[i] = len(input_ids) - 1
            if batch.num_new_tokens[i] != 1:
                query_start.append(query_start[-1] + count)
        as_long = {"dtype": torch.long, "device": self.device}
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, **as_long),
            num_decode_seqs=len(decodes),
            decode_block_tables=self._block_table([batch.seqs[i] for i in decodes]).to(self.device),
            decode_context_lens=torch.tensor(
                [batch.seqs[i].num_computed_tokens + 1 for i in decodes], **as_long
            ),
            prefill_block_tables=self._block_table([batch.seqs[i] for i in prefills]).to(self.device),
            prefill_context_lens=torch.tensor(
                [batch.seqs[i].num_computed_tokens + batch.num_new_tokens[i] for i in prefills], **as_long
            ),
            prefill_query_start_loc=torch.tensor(query_start, **as_long),
        )
        sampling = [
            i for i, seq in enumerate(batch.seqs) if seq.num_computed_tokens + batch.num_new_tokens[i] == seq.num_tokens
        ]
        return PreparedBatch(
            input_ids=torch.tensor(input_ids, **as_long),
            positions=torch.tensor(positions, **as_long),
            meta=meta,
            sample_rows=torch.tensor([last_row[i] for i in sampling], **as_long),
            sampling_seqs=[batch.seqs[i] for i in sampling],
        )

    def _graph_size(self, batch: ScheduledBatch) -> int | None:
        if self.graphs is None or any(count != 1 for count in batch.num_new_tokens):
            return None
        return self.graphs.padded_size(len(batch.seqs))

    def _replay_decode(self, seqs: list[Sequence], size: int) -> torch.Tensor:
        """Logits [len(seqs), vocab] of a decode-only batch, from the graph of `size` rows."""
        positions = [seq.num_computed_tokens for seq in seqs]
        padding = size - len(seqs)
        step_inputs = torch.empty(4, size, dtype=torch.long)
        step_inputs[TOKEN] = torch.tensor([seq.token_ids[p] for seq, p in zip(seqs, positions, strict=True)] + [0] * padding)
        step_inputs[POSITION] = torch.tensor(positions + [0] * padding)
        slots = [seq.block_ids[p // self.block_size] * self.block_size + p % self.block_size
                 for seq, p in zip(seqs, positions, strict=True)]  # fmt: skip
        step_inputs[SLOT] = torch.tensor(slots + [NULL_BLOCK_ID * self.block_size] * padding)
        step_inputs[CONTEXT_LEN] = torch.tensor([p + 1 for p in positions] + [1] * padding)
        logits = self.graphs.replay(step_inputs, self._block_table(seqs))  # type: ignore[union-attr]
        return logits[: len(seqs)]

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> tuple[list[Sequence], SamplerOutput]:
        """Forward the batch; sample one token for each sequence that computed all its known tokens."""
        graph_size = self._graph_size(batch)
        if graph_size is not None:
            logits = self._replay_decode(batch.seqs, graph_size)
            # A one-token prefill chunk that stops short of the prompt's end samples nothing.
            rows = [i for i, seq in enumerate(batch.seqs) if seq.num_computed_tokens + 1 == seq.num_tokens]
            sampling_seqs = [batch.seqs[i] for i in rows]
            if len(rows) < len(batch.seqs):
                logits = logits[rows]
            return sampling_seqs, sample(logits, sampling_seqs)
        prepared = self.prepare(batch)
        hidden = self.model.forward(prepared.input_ids, prepared.positions, prepared.meta, self.pool)
        if not prepared.sampling_seqs:
            return [], SamplerOutput([], [])
        logits = self.model.logits(hidden[prepared.sample_rows])
        return prepared.sampling_seqs, sample(logits, prepared.sampling_seqs)
