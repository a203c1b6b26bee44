"""Turns a scheduled batch into tensors, runs the model over the paged pool, and samples.

Decode-only batches replay a CUDA graph when the runner has them (engine/cuda_graphs.py); every other batch,
and every batch on the CPU, runs the model eagerly. `launch` queues the GPU work and returns at once;
`collect` samples, which waits for it, so the engine can prepare the next step while the GPU runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvferry.engine.attention_metadata import AttentionMetadata
from kvferry.engine.cuda_graphs import CONTEXT_LEN, POSITION, SLOT, TOKEN, DecodeGraphs
from kvferry.engine.model import CausalLM
from kvferry.engine.sampler import PendingSample, SamplerOutput, sample_async
from kvferry.engine.scheduler import ScheduledBatch
from kvferry.engine.sequence import Sequence
from kvferry.kvcache.allocator import NULL_BLOCK_ID
from kvferry.kvcache.kv_pool import KVPool


@dataclass
class Launched:
    """A batch whose forward is queued: the logits rows to sample, one per sequence in `sampling_seqs`."""

    sampling_seqs: list[Sequence]
    logits: torch.Tensor | None
    sampled: PendingSample | None = None  # set once its sampling is queued (sample_ahead)


class BlockTableRows:
    """The decode graphs' block tables, kept on the host (pinned on CUDA) and updated in place: a row is
    written again only where its sequence's block list grew or was replaced. At a steady decode batch
    that is one new block per row every block_size steps, where building the table from lists again each
    step cost a few microseconds a row. Block lists only grow in place (`extend`) or are replaced by
    a new list, so holding the list a row was written from tells which entries are still right."""

    def __init__(self, rows: int, width: int, pin: bool) -> None:
        self.table = torch.full((rows, width), NULL_BLOCK_ID, dtype=torch.long, pin_memory=pin)
        self._array = self.table.numpy()
        self._lists: list[list[int] | None] = [None] * rows
        self._written = [0] * rows

    def fill(self, seqs: list[Sequence]) -> torch.Tensor:
        """[len(seqs), width]: row i holds seqs[i]'s blocks (entries past them are stale, never read)."""
        for row, seq in enumerate(seqs):
            blocks = seq.block_ids
            start = self._written[row] if self._lists[row] is blocks else 0
            if start < len(blocks):
                self._array[row, start : len(blocks)] = blocks[start:]
                self._lists[row] = blocks
                self._written[row] = len(blocks)
        return self.table[: len(seqs)]


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
        self.block_size = pool.block_size
        self.graphs = graphs
        self._graph_inputs: tuple[DecodeGraphs, list[tuple[torch.Tensor, BlockTableRows]]] | None = None
        self._graph_steps = 0  # picks which of the two host input buffers a replay fills

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

    def _graph_buffers(self, graphs: DecodeGraphs) -> tuple[torch.Tensor, BlockTableRows]:
        """Host-side step inputs and block tables for these graphs, made once (tests swap `graphs` in). Two
        sets, used in turn: when the engine launches a step ahead, the copy out of the previous step's set
        may still be queued behind the step before it."""
        if self._graph_inputs is None or self._graph_inputs[0] is not graphs:
            pin = self.device.type == "cuda"
            sets = [
                (torch.empty(4 * graphs.max_batch, dtype=torch.long, pin_memory=pin),
                 BlockTableRows(graphs.max_batch, graphs.block_tables.shape[1], pin))
                for _ in range(2)
            ]  # fmt: skip
            self._graph_inputs = graphs, sets
        self._graph_steps += 1
        return self._graph_inputs[1][self._graph_steps % 2]

    def _replay_decode(self, seqs: list[Sequence], size: int, feedback: torch.Tensor | None) -> torch.Tensor:
        """Queues the graph of `size` rows for a decode-only batch; its logits [size, vocab] on the device.
        feedback: the rows' input tokens on the device (the previous step's samples), in place of the
        host's token ids, which are placeholders then."""
        graphs = self.graphs
        assert graphs is not None
        flat_inputs, tables = self._graph_buffers(graphs)
        step_inputs = flat_inputs[: 4 * size].view(4, size)  # contiguous, as the graph's own buffer
        positions = [seq.num_computed_tokens for seq in seqs]
        batch, block_size = len(seqs), self.block_size
        inputs = step_inputs.numpy()
        inputs[TOKEN, :batch] = [seq.token_ids[p] for seq, p in zip(seqs, positions, strict=True)]
        inputs[POSITION, :batch] = positions
        inputs[SLOT, :batch] = [seq.block_ids[p // block_size] * block_size + p % block_size
                                for seq, p in zip(seqs, positions, strict=True)]  # fmt: skip
        inputs[CONTEXT_LEN, :batch] = [p + 1 for p in positions]
        # Padding rows: token 0 at position 0 into slot 0 of the null block, with a context of one token.
        inputs[TOKEN, batch:] = 0
        inputs[POSITION, batch:] = 0
        inputs[SLOT, batch:] = NULL_BLOCK_ID * block_size
        inputs[CONTEXT_LEN, batch:] = 1
        return graphs.replay(step_inputs, tables.fill(seqs), feedback)

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, feedback: torch.Tensor | None = None) -> Launched:
        """Queue the batch's forward; sampling waits in collect(). Which sequences sample is fixed here,
        from the state the batch was scheduled with. feedback: the batch's input tokens on the device, one
        per sequence (a decode-only batch that replays a graph only)."""
        graph_size = self._graph_size(batch)
        if graph_size is None and feedback is not None:
            raise ValueError("device-side input tokens need a batch that replays a decode graph")
        if graph_size is not None:
            logits = self._replay_decode(batch.seqs, graph_size, feedback)[: len(batch.seqs)]
            # A one-token prefill chunk that stops short of the prompt's end samples nothing.
            rows = [i for i, seq in enumerate(batch.seqs) if seq.num_computed_tokens + 1 == seq.num_tokens]
            if len(rows) < len(batch.seqs):
                logits = logits[rows]
            return Launched([batch.seqs[i] for i in rows], logits)
        prepared = self.prepare(batch)
        hidden = self.model.forward(prepared.input_ids, prepared.positions, prepared.meta, self.pool)
        if not prepared.sampling_seqs:
            return Launched([], None)
        return Launched(prepared.sampling_seqs, self.model.logits(hidden[prepared.sample_rows]))

    @torch.inference_mode()
    def sample_ahead(self, launched: Launched) -> torch.Tensor:
        """Queue the batch's sampling now (before the next graph replay overwrites its logits); its tokens,
        on the device, one per sampling sequence."""
        assert launched.logits is not None
        if launched.sampled is None:
            launched.sampled = sample_async(launched.logits, launched.sampling_seqs)
        return launched.sampled.token_ids

    @torch.inference_mode()
    def collect(self, launched: Launched) -> tuple[list[Sequence], SamplerOutput]:
        """Sample one token for each sequence that computed all its known tokens."""
        if launched.logits is None:
            return [], SamplerOutput([], [])
        sampled = launched.sampled or sample_async(launched.logits, launched.sampling_seqs)
        return launched.sampling_seqs, sampled.result()
