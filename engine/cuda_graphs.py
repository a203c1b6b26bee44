"""CUDA graphs for decode-only batches: one graph per captured batch size, a batch padded up to the next.

A decode step of an 8B model launches ~400 kernels; launched one by one from Python they take longer
than the step's memory traffic. Each graph replays them all with one launch. The graphs read their inputs
from static buffers, so a step copies its token ids, positions, slots, context lengths and block tables
into those buffers and replays. Padding rows decode token 0 at position 0 into the null block, which no
sequence owns, with a context of one token.
The block-table buffer is as wide as max_model_len needs, which fixes the attention's span count per
graph; spans past a context's end exit at once.
"""

from __future__ import annotations

import bisect

import torch

from kvferry.engine.attention_metadata import AttentionMetadata
from kvferry.engine.model import CausalLM
from kvferry.kvcache.allocator import NULL_BLOCK_ID
from kvferry.kvcache.kv_pool import KVPool

# Rows of the packed step inputs: one host-to-device copy carries them all.
TOKEN, POSITION, SLOT, CONTEXT_LEN = range(4)


class DecodeGraphs:
    def __init__(
        self, model: CausalLM, pool: KVPool, batch_sizes: list[int], max_blocks_per_seq: int, eager: bool = False
    ) -> None:
        """eager: capture nothing and run the same forward over the same buffers at each replay, so the
        batch packing and padding can be checked on the CPU."""
        self.model = model
        self.eager = eager
        self.pool = pool
        self.batch_sizes = sorted(batch_sizes)
        device = pool.tensor.device
        largest = self.batch_sizes[-1]
        # Each size's graph reads its [4, size] inputs from the front of one flat buffer, so a step's inputs
        # arrive in one contiguous copy from the runner's pinned host buffer.
        self.step_inputs = torch.zeros(4 * largest, dtype=torch.long, device=device)
        self.block_tables = torch.full((largest, max_blocks_per_seq), NULL_BLOCK_ID, dtype=torch.long, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.num_replays = 0  # decode steps served by this object, so tests can tell graphs ran
        self.num_fed_replays = 0  # of those, steps launched ahead (their input tokens fed on the device)
        if not eager:
            self._capture_all()

    @property
    def max_batch(self) -> int:
        return self.batch_sizes[-1]

    def inputs(self, size: int) -> torch.Tensor:
        """The [4, size] step inputs (token, position, slot, context length) the graph of `size` reads."""
        return self.step_inputs[: 4 * size].view(4, size)

    def _forward(self, size: int) -> torch.Tensor:
        inputs = self.inputs(size)
        empty = self.block_tables[:0]
        meta = AttentionMetadata(
            slot_mapping=inputs[SLOT],
            num_decode_seqs=size,
            decode_block_tables=self.block_tables[:size],
            decode_context_lens=inputs[CONTEXT_LEN],
            prefill_block_tables=empty,
            prefill_context_lens=inputs[CONTEXT_LEN, :0],
            prefill_query_start_loc=inputs[CONTEXT_LEN, :1],
        )
        hidden = self.model.forward(inputs[TOKEN], inputs[POSITION], meta, self.pool)
        return self.model.logits(hidden)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        memory_pool = torch.cuda.graph_pool_handle()
        # Largest first: the smaller graphs then fit in the memory the largest one's pool already holds.
        for size in reversed(self.batch_sizes):
            self.step_inputs.zero_()
            self.inputs(size)[CONTEXT_LEN].fill_(1)  # padding's values: slot 0 of the null block
            self._forward(size)  # compiles the Triton kernels for this size outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=memory_pool):
                self.logits[size] = self._forward(size)
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def padded_size(self, batch: int) -> int | None:
        """The captured size this batch replays at, or None if it is larger than every graph."""
        index = bisect.bisect_left(self.batch_sizes, batch)
        return self.batch_sizes[index] if index < len(self.batch_sizes) else None

    def replay(
        self, step_inputs: torch.Tensor, block_tables: torch.Tensor, feedback: torch.Tensor | None = None
    ) -> torch.Tensor:
        """step_inputs [4, padded size] on the host, contiguous, padding included; block_tables [batch,
        width] for the real rows. Both are copied without waiting (pinned host memory on CUDA: the caller
        keeps them unchanged until the copies have run). feedback: the real rows' tokens on the device,
        which replace the host's. Returns the padded batch's float32 logits, valid until the next replay."""
        size = step_inputs.shape[1]
        batch, width = block_tables.shape
        self.inputs(size).copy_(step_inputs, non_blocking=True)
        if feedback is not None:
            self.inputs(size)[TOKEN, :batch].copy_(feedback)
            self.num_fed_replays += 1
        self.block_tables[:batch, :width].copy_(block_tables, non_blocking=True)
        self.num_replays += 1
        if self.eager:
            return self._forward(size)
        self.graphs[size].replay()
        return self.logits[size]
