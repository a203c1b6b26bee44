"""Continuous batching with chunked prefill under a per-step token budget, and preemption by recompute.

Each step serves running sequences first (a decode costs one token of budget, an unfinished prefill its
next chunk), then admits waiting ones while budget, `max_num_seqs` and blocks allow, in arrival order except
that a prompt whose next uncached block a running sequence is computing waits for it (SGLang's in-batch
prefix caching: requests sharing a system prompt that arrive together compute it once). When a running
sequence needs a block and none is left, the newest running sequence is preempted: its blocks are freed
and it waits at the head of the queue to be computed again (its old blocks may still hit the prefix
cache). Requests that could never fit are refused at admission, so the loop cannot livelock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kvferry.engine.block_manager import BlockManager
from kvferry.engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048


@dataclass
class ScheduledBatch:
    seqs: list[Sequence]
    num_new_tokens: list[int]

    @property
    def empty(self) -> bool:
        return not self.seqs


class Scheduler:
    def __init__(self, config: SchedulerConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        budget = self.config.max_num_batched_tokens
        batch = ScheduledBatch([], [])
        preempted = False
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            count = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.block_manager.allocate_slots(seq, count):
                self._preempt(self.running.pop())
                preempted = True
                if seq.status is SequenceStatus.WAITING:
                    break
            else:
                batch.seqs.append(seq)
                batch.num_new_tokens.append(count)
                budget -= count
                index += 1
        # Admitting right after a preemption would only take the blocks back from the preempted one.
        # Without a prefix cache there is nothing to wait for; with nothing waiting, nothing to look up (most
        # decode steps: the set is not built for them).
        caching = self.block_manager.allocator.enable_prefix_caching
        in_flight = self._blocks_being_computed() if caching and self.waiting and not preempted else None
        position = 0
        while not preempted and position < len(self.waiting) and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[position]
            self.block_manager.take_prefix_hits(seq)
            next_block = seq.num_computed_tokens // self.block_manager.block_size
            if in_flight is not None and next_block < len(seq.block_hashes) and seq.block_hashes[next_block] in in_flight:
                # A running sequence is computing this prompt's next block right now (the same system prompt,
                # arrived together): wait for it to land in the prefix cache rather than compute it twice.
                self._release(seq)
                position += 1
                continue
            count = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self.block_manager.allocate_slots(seq, count):
                self._release(seq)
                break
            if seq.num_cached_tokens == 0 and seq.num_output_tokens == 0:
                seq.num_cached_tokens = seq.num_computed_tokens
            del self.waiting[position]
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            if in_flight is not None:
                in_flight.update(seq.block_hashes[seq.num_computed_tokens // self.block_manager.block_size :])
            batch.seqs.append(seq)
            batch.num_new_tokens.append(count)
            budget -= count
        return batch

    def _blocks_being_computed(self) -> set[int]:
        """Hashes of the prompt blocks running sequences have yet to finish computing."""
        return {block_hash for seq in self.running for block_hash in seq.block_hashes[seq.num_registered_blocks :]}

    def _release(self, seq: Sequence) -> None:
        """Give back the prefix hits a waiting sequence took, leaving it as it was."""
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str, stop_reason: str | int | None = None) -> None:
        """Free a sequence that stopped, was aborted or ran out of room; it may be waiting or running."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
