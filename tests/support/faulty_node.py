"""A real kvferry node whose engine fails on purpose, for fault tests only.

    python -m support.faulty_node --fail-when-running K decode --model ... (the usual node flags)
    python -m support.faulty_node --die-before-transfer prefill --model ...
    python -m support.faulty_node --min-step-seconds S decode --model ...

--fail-when-running: the engine raises from the first step that would run with K or more requests in
the batch, as a CUDA error or a kernel bug would. --die-before-transfer: a prefill node's process exits
at once when its first KV transfer would begin (prefill done, blocks held, nothing sent). Everything
after that is the product's real failure handling. --min-step-seconds: every engine step that ran a batch
lasts at least S seconds (it sleeps out the rest), as a model larger than the tiny one would: a test that
needs streams still decoding when it acts gets them for at least S seconds a token, however fast the CPU
kernels, without changing a token.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from kvferry.cli import main as kvferry_main
from kvferry.engine.llm_engine import LLMEngine
from kvferry.transfer.kv_connector import KVSender


class InjectedEngineFailure(RuntimeError):
    pass


def fail_when_running(count: int) -> None:
    original_step = LLMEngine.step

    def step(self: LLMEngine) -> list:
        if len(self.scheduler.running) >= count:
            raise InjectedEngineFailure(f"injected failure with {len(self.scheduler.running)} requests running")
        return original_step(self)

    LLMEngine.step = step  # type: ignore[method-assign]


def min_step_seconds(seconds: float) -> None:
    original_step = LLMEngine.step

    def step(self: LLMEngine) -> list:
        started = time.perf_counter()
        outputs = original_step(self)
        if outputs:
            time.sleep(max(0.0, seconds - (time.perf_counter() - started)))
        return outputs

    LLMEngine.step = step  # type: ignore[method-assign]


def die_before_transfer() -> None:
    def send_blocks(*_: object, **__: object) -> int:
        os._exit(17)  # no cleanup, no goodbye: as a killed process

    KVSender.send_blocks = send_blocks  # type: ignore[method-assign]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-when-running", type=int, default=None)
    parser.add_argument("--die-before-transfer", action="store_true")
    parser.add_argument("--min-step-seconds", type=float, default=None)
    options, node_argv = parser.parse_known_args()
    if options.fail_when_running is not None:
        fail_when_running(options.fail_when_running)
    if options.die_before_transfer:
        die_before_transfer()
    if options.min_step_seconds is not None:
        min_step_seconds(options.min_step_seconds)
    sys.exit(kvferry_main(node_argv))
