"""Runs tests/interpreted_kernels, every Triton kernel under Triton's interpreter, in a pytest process of its own.

TRITON_INTERPRET must be set before triton decorates the kernels and must not leak into this process
(tests/interpreted_kernels/conftest.py says why), so the variable is given to the child process only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

KERNEL_TESTS = Path(__file__).resolve().parents[1] / "interpreted_kernels"
REPO_ROOT = KERNEL_TESTS.parents[1]


# Two complementary halves, run at once: the interpreter is one busy core per process, and the prefill
# attention tests alone are nearly half of the suite's 85 s (one process took 66 s of CI).
SHARDS = ("test_interpreted_attention and prefill", "not (test_interpreted_attention and prefill)")


@pytest.mark.slow
def test_triton_kernels_under_the_interpreter():
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("this process interprets Triton already and collects tests/interpreted_kernels itself")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    commands = [[sys.executable, "-m", "pytest", str(KERNEL_TESTS), "-q", "-p", "no:cacheprovider", "-W",
                 "ignore::RuntimeWarning", "-k", shard] for shard in SHARDS]  # fmt: skip
    children = [subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for command in commands]  # fmt: skip
    try:
        for command, child in zip(commands, children, strict=True):
            stdout, stderr = child.communicate(timeout=540)
            print(stdout[-3000:])
            assert child.returncode == 0, f"{' '.join(command)} failed:\n{stdout[-20000:]}\n{stderr[-5000:]}"
    finally:  # a failed or timed-out half must not leave the other running past the test
        for child in children:
            child.kill()
            child.wait()
