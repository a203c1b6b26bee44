"""Turns the last-position logits of a batch into next tokens, honouring each sequence's SamplingParams.

A batch where every row is greedy and unpenalized takes one argmax; otherwise rows are filtered together
(temperature, top-k, top-p, min-p on one sort) and drawn with the row's own generator when it has a seed,
so a seeded request reproduces whatever else shares its batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from kvferry.engine.grammar import mask_disallowed

if TYPE_CHECKING:  # a sequence skips its draws through this module when it resumes
    from kvferry.engine.sequence import Sequence


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """vLLM/OpenAI semantics: repetition over prompt + output, presence/frequency over the output."""
    vocab = logits.shape[1]
    for row, seq in enumerate(seqs):
        params = seq.params
        if not params.needs_penalties:
            continue
        output_counts = torch.bincount(torch.tensor(seq.output_token_ids, dtype=torch.long), minlength=vocab)
        output_counts = output_counts[:vocab].to(logits.device, logits.dtype)
        if params.repetition_penalty != 1.0:
            seen = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
            seen[torch.tensor(seq.token_ids, device=logits.device)] = True
            row_logits = logits[row]
            penalized = torch.where(
                row_logits > 0, row_logits / params.repetition_penalty, row_logits * params.repetition_penalty
            )
            logits[row] = torch.where(seen, penalized, row_logits)
        logits[row] -= params.frequency_penalty * output_counts
        logits[row] -= params.presence_penalty * (output_counts > 0).to(logits.dtype)


def hold_back_ends(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """A sequence short of its min_tokens cannot sample a token that would end it (EOS, its stop_token_ids)."""
    vocab = logits.shape[1]
    for row, seq in enumerate(seqs):
        if not seq.may_end:
            ends = [token for token in seq.end_token_ids if token < vocab]
            logits[row, ends] = float("-inf")


def _filtered_probs(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    device = logits.device
    temperatures = torch.tensor([s.params.temperature or 1.0 for s in seqs], device=device)
    logits = logits / temperatures[:, None]
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[1]
    # Capped at the vocabulary: a top_k beyond int64 would not even fit the tensor.
    top_k = torch.tensor([min(s.params.top_k, vocab) if s.params.top_k > 0 else vocab for s in seqs], device=device)
    top_p = torch.tensor([s.params.top_p for s in seqs], device=device)
    min_p = torch.tensor([s.params.min_p for s in seqs], device=device)
    ranks = torch.arange(vocab, device=device)[None, :]
    sorted_probs = sorted_logits.softmax(dim=-1)
    # Keep a token while the mass before it is below top_p.
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop = (ranks >= top_k[:, None]) | (mass_before >= top_p[:, None])
    drop |= sorted_probs < min_p[:, None] * sorted_probs[:, :1]
    # A top_p below float32's range rounds to 0 and would drop the top token too: it always stays.
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    filtered = torch.full_like(logits, float("-inf")).scatter_(1, sorted_ids, sorted_logits)
    return filtered.softmax(dim=-1)


def _top_logprobs(logprobs: torch.Tensor, token_id: int, count: int) -> dict[int, float]:
    result = {token_id: float(logprobs[token_id])}
    if count:
        values, ids = logprobs.topk(count)
        result.update(zip(ids.tolist(), values.tolist(), strict=True))
    return result


@dataclass
class PendingSample:
    """A batch's tokens, drawn on the device and on their way to the host. `token_ids` stays on the device,
    where the next step can read it before the host has (llm_engine's launch ahead); `result` waits only
    for this batch's sampling, not for whatever was queued after it."""

    token_ids: torch.Tensor
    host_token_ids: torch.Tensor
    ready: torch.cuda.Event | None
    raw_logprobs: torch.Tensor | None
    wants_logprobs: list[int | None]

    def result(self) -> SamplerOutput:
        if self.ready is not None:
            self.ready.synchronize()
        tokens = self.host_token_ids.tolist()
        raw = self.raw_logprobs
        logprobs: list[dict[int, float] | None] = [
            None if count is None else _top_logprobs(raw[row], tokens[row], count)  # type: ignore[index]
            for row, count in enumerate(self.wants_logprobs)
        ]
        return SamplerOutput(tokens, logprobs)


def _seeded_draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token from one row of probabilities. How many random numbers this takes depends on the row's
    length and device only, not on its values (multinomial draws one exponential per entry): so
    skip_seeded_draws can replay it."""
    return torch.multinomial(probs, 1, generator=generator)[0]


def skip_seeded_draws(generator: torch.Generator, vocab_size: int, count: int) -> None:
    """Advance a seeded generator past the draws of `count` sampled tokens, as if it had sampled them: a
    completion resumed on another node (its first node died) then draws what it would have drawn."""
    uniform = torch.full((vocab_size,), 1.0 / vocab_size, device=generator.device)
    for _ in range(count):
        _seeded_draw(uniform, generator)


def sample_async(logits: torch.Tensor, seqs: list[Sequence]) -> PendingSample:
    """Queue the sampling of one token per row; logits: [len(seqs), vocab] float32, one row per sequence
    that samples this step."""
    wants_logprobs = [s.params.logprobs for s in seqs]
    raw_logprobs = logits.log_softmax(dim=-1) if any(w is not None for w in wants_logprobs) else None
    if any(s.params.needs_penalties or not s.may_end or s.grammar is not None for s in seqs):
        # In place: the logits are this step's own (a new tensor, or a CUDA graph's output that the next replay
        # rewrites) and their log-probabilities are taken above; a copy cost 3 ms a step at 64 x 49,152 on the CPU.
        apply_penalties(logits, seqs)
        hold_back_ends(logits, seqs)
        if any(s.grammar is not None for s in seqs):
            mask_disallowed(logits, seqs)
    token_ids = logits.argmax(dim=-1)
    random_rows = [row for row, s in enumerate(seqs) if not s.params.greedy]
    if random_rows:
        probs = _filtered_probs(logits[random_rows], [seqs[r] for r in random_rows])
        unseeded = [i for i, r in enumerate(random_rows) if seqs[r].generator is None]
        if unseeded:
            token_ids[[random_rows[i] for i in unseeded]] = torch.multinomial(probs[unseeded], 1).squeeze(1)
        for i, row in enumerate(random_rows):
            generator = seqs[row].generator
            if generator is not None:
                token_ids[row] = _seeded_draw(probs[i], generator)
    if token_ids.device.type != "cuda":
        return PendingSample(token_ids, token_ids, None, raw_logprobs, wants_logprobs)
    # A copy into pinned memory and an event: waiting on a plain .tolist() would also wait for every
    # step queued after this one.
    host = torch.empty(token_ids.shape, dtype=token_ids.dtype, pin_memory=True)
    host.copy_(token_ids, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return PendingSample(token_ids, host, ready, raw_logprobs, wants_logprobs)

