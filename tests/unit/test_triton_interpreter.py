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


@pytest.mark.slow
def test_triton_kernels_under_the_interpreter():
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("this process interprets Triton already and collects tests/interpreted_kernels itself")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-m", "pytest", str(KERNEL_TESTS), "-q", "-p", "no:cacheprovider", "-W", "ignore::RuntimeWarning"]
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=540)
    print(result.stdout[-3000:])
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-20000:]}\n{result.stderr[-5000:]}"
