"""Child processes of one test module (nodes, routers: `python -m kvferry ...`), each in its own session, with
logs shown on failure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

STARTUP_SECONDS = 180


class Processes:
    """Child processes of one test module, each in its own session, with logs shown on failure."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: list[tuple[str, subprocess.Popen]] = []

    def spawn(self, name: str, *args: str) -> None:
        log = open(self.folder / f"{name}.log", "w")  # noqa: SIM115 - open while the child runs
        process = subprocess.Popen([sys.executable, "-m", "kvferry", *args], stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.started.append((name, process))

    def wait_healthy(self, urls: dict[str, str], path: str = "/health") -> None:
        deadline = time.monotonic() + STARTUP_SECONDS
        pending = dict(urls)
        while pending and time.monotonic() < deadline:
            for name, process in self.started:
                assert process.poll() is None, f"{name} exited: {self.log(name)}"
            for name, url in list(pending.items()):
                try:
                    if httpx.get(url + path, timeout=1).status_code == 200:
                        del pending[name]
                except httpx.HTTPError:
                    pass
            time.sleep(0.3)
        assert not pending, f"not healthy: {pending}"

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text()[-3000:]

    def stop(self) -> None:
        for _, process in reversed(self.started):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for _, process in self.started:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
