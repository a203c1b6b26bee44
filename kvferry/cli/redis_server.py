"""Start a real redis-server on a free loopback port and wait until it answers (kvferry up, tests,
benchmarks)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

from kvferry.cli.ports import free_port


class RedisServer:
    def __init__(self, workdir: Path, log: Path | None = None, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not installed (Debian: apt-get install redis-server)")
        self.port = port or free_port()  # a given port: a restart where clients expect the old server
        self.url = f"redis://127.0.0.1:{self.port}/0"
        output = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - lives as long as the server
        self.process = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no", "--dir", str(workdir)],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in a terminal reaches the owner, which stops it in order
        )
        self._wait_for_pong()

    def _wait_for_pong(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
