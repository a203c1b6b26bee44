"""A real kvferry node whose engine fails on purpose, for fault tests only.

    python -m tests.support.faulty_node --fail-when-running K decode --model ... (the usual node flags)

The engine raises from the first step that would run with K or more requests in the batch, as a
CUDA error or a kernel bug would: everything after that is the product's real failure handling.
"""

from __future__ import annotations

import argparse
import sys

from kvferry.engine.llm_engine import LLMEngine

from kvferry.cli import main as kvferry_main


class InjectedEngineFailure(RuntimeError):
    pass


def fail_when_running(count: int) -> None:
    original_step = LLMEngine.step

    def step(self: LLMEngine) -> list:
        if len(self.scheduler.running) >= count:
            raise InjectedEngineFailure(f"injected failure with {len(self.scheduler.running)} requests running")
        return original_step(self)

    LLMEngine.step = step  # type: ignore[method-assign]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-when-running", type=int, required=True)
    options, node_argv = parser.parse_known_args()
    fail_when_running(options.fail_when_running)
    sys.exit(kvferry_main(node_argv))
