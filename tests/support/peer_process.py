"""Start and drive a support.transfer_peer process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# The peer imports `support.*` from tests/, and only from there: -P keeps the checkout root (its cwd) off
# its sys.path, where folders such as kernels/ would stand in for installed packages (tests/conftest.py).
TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
STOP_WAIT_SECONDS = 10


class PeerProcess:
    def __init__(self, name: str, registry: str, module: str = "support.transfer_peer", **options: object) -> None:
        self.name = name
        args = [sys.executable, "-P", "-m", module, "--name", name, "--registry", registry]
        for key, value in options.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        env = {**os.environ, "UCX_WARN_UNUSED_ENV_VARS": "n", "PYTHONPATH": str(TESTS)}
        self.process = subprocess.Popen(
            args, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None if os.environ.get("KVFERRY_LOG_LEVEL") else subprocess.DEVNULL, text=True
        )
        ready = self._read()
        assert ready.get("ready"), ready

    def _read(self) -> dict:
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"peer exited with {self.process.wait()}")
        return json.loads(line)

    def call(self, cmd: str, **fields: object) -> dict:
        self.process.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        return self._read()

    def pause(self) -> None:
        """SIGSTOP, returned once every thread has stopped. The kernel stops a process's threads as each next
        runs, not within kill(): on a busy machine the peer's UCX thread answered a message sent after kill()
        had returned (a hello the test expected to time out was acknowledged, once in CI)."""
        os.kill(self.process.pid, signal.SIGSTOP)
        if not self.wait_stopped(STOP_WAIT_SECONDS):
            raise RuntimeError(f"peer {self.name} did not stop within {STOP_WAIT_SECONDS} s of SIGSTOP")

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def stopped(self) -> bool:
        """Every thread of it is stopped (SIGSTOP): each one's state in /proc is T."""
        states = []
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            try:
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
        return bool(states) and all(state == "T" for state in states)

    def wait_stopped(self, timeout: float) -> bool:
        """Whether every thread of it stopped within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not self.stopped():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def close(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            try:
                self.call("quit")
                self.process.wait(timeout=5)
            except (BrokenPipeError, RuntimeError, subprocess.TimeoutExpired):
                self.kill()
