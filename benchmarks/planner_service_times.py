"""Service times for the planner simulations (planner_trace, planner_kwok), measured on kvferry's own engine.

A node's costs on this machine: the real default model (SmolLM2-135M) in kvferry's engine on the CPU, one
torch thread (a node pinned to one core, as the CPU benchmarks run them), the engine's default arguments.
- prefill: seconds to compute a prompt of N tokens (one request alone, prompt and first token), for a few N;
- decode: seconds of one step with B running sequences (64-token prompts), the median of a few steps, for a
  few B;
- KV: the tokens a decode node's pool holds (the engine's default budget on the CPU).
Times are the process's CPU time, not wall time: with one thread that is the node's work, and other jobs on
a shared machine stretch wall times far more than CPU times (benchmarks/cpu_decode_steps.py does the same).
The curves the simulator uses are least-squares fits: prefill a + b N + c N^2 (attention makes long prompts
cost more than linearly), decode a + b B. The points go into the result, so a later run can reuse them
(`--service-times RESULT.json`) instead of measuring again.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy

PREFILL_TOKENS = (128, 256, 512, 1024, 2048)
DECODE_BATCHES = (1, 4, 16, 32, 64)
QUICK_PREFILL_TOKENS = (128, 512)
QUICK_DECODE_BATCHES = (1, 8)
DECODE_PROMPT_TOKENS = 64
TIMED_STEPS = 8


@dataclass(frozen=True)
class ServiceTimes:
    """What a prefill and a decode node cost, as measured points and the curves fitted through them."""

    prefill_points: tuple[tuple[int, float], ...]  # (prompt tokens, seconds)
    decode_points: tuple[tuple[int, float], ...]  # (running sequences, seconds per step)
    kv_tokens: int  # one decode node's KV pool, in tokens
    max_batch: int  # the engine's max_num_seqs

    def __post_init__(self) -> None:
        # two points fit a line, three a parabola: a quick measurement's prefill curve is a line
        degree = min(2, len(self.prefill_points) - 1)
        object.__setattr__(self, "_prefill", numpy.polynomial.Polynomial.fit(*zip(*self.prefill_points, strict=True),
                                                                             degree).convert())
        object.__setattr__(self, "_step", numpy.polynomial.Polynomial.fit(*zip(*self.decode_points, strict=True),
                                                                          1).convert())

    def prefill_s(self, tokens: int) -> float:
        """Seconds one prefill node takes for a prompt alone (never below the smallest one measured)."""
        return max(float(self._prefill(tokens)), min(seconds for _, seconds in self.prefill_points))  # type: ignore[attr-defined]

    def step_s(self, batch: int) -> float:
        """Seconds of one decode step that advances `batch` streams by a token each."""
        return max(float(self._step(batch)), min(seconds for _, seconds in self.decode_points))  # type: ignore[attr-defined]

    def as_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, fields: dict[str, object]) -> ServiceTimes:
        return cls(tuple(map(tuple, fields["prefill_points"])), tuple(map(tuple, fields["decode_points"])),  # type: ignore[arg-type]
                   int(fields["kv_tokens"]), int(fields["max_batch"]))  # type: ignore[arg-type]

    @classmethod
    def from_result(cls, path: Path) -> ServiceTimes:
        """The service times a planner_trace result recorded (its summary's `service_times`)."""
        return cls.from_json(json.loads(path.read_text())["summary"]["service_times"])


def measure(quick: bool = False) -> ServiceTimes:
    """Measured now on this machine's CPU (about a minute; a few seconds with `quick`)."""
    import torch  # here: importing the benchmark loads no torch

    from kvferry.engine import LLM, SamplingParams
    from kvferry.engine.model_source import default_model

    torch.set_num_threads(1)
    engine = LLM(default_model(), device="cpu").engine
    rng = random.Random(0)

    def add(tokens: int, max_tokens: int) -> None:
        prompt = [rng.randrange(1000, 20000) for _ in range(tokens)]
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(f"r{rng.random()}", {"prompt_token_ids": prompt}, params)

    def prefill_s(tokens: int) -> float:
        add(tokens, 1)
        started = time.process_time()
        while engine.has_unfinished_requests():
            engine.step()
        return time.process_time() - started

    def step_s(batch: int) -> float:
        for _ in range(batch):
            add(DECODE_PROMPT_TOKENS, TIMED_STEPS + 2)
        while any(seq.num_computed_tokens < DECODE_PROMPT_TOKENS for seq in _running(engine)):
            engine.step()  # the prompts, which the timed steps must not include
        steps = []
        while engine.has_unfinished_requests():
            started = time.process_time()
            engine.step()
            steps.append(time.process_time() - started)
        return statistics.median(steps)

    prefill_s(DECODE_PROMPT_TOKENS)  # warm-up: first calls allocate
    prefill_tokens = QUICK_PREFILL_TOKENS if quick else PREFILL_TOKENS
    decode_batches = QUICK_DECODE_BATCHES if quick else DECODE_BATCHES
    prefill = tuple((tokens, round(prefill_s(tokens), 4)) for tokens in prefill_tokens)
    decode = tuple((batch, round(step_s(batch), 5)) for batch in decode_batches)
    kv_tokens = (engine.allocator.num_blocks - 1) * engine.args.block_size  # block 0 is the null block
    return ServiceTimes(prefill, decode, kv_tokens, engine.args.max_num_seqs)


def _running(engine: object) -> list:
    return [seq for request in engine.requests.values() for seq in request.seqs]  # type: ignore[attr-defined]
