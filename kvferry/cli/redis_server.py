"""Start a real redis-server on a free loopback port and wait until it answers (kvferry up, tests,
benchmarks)."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

# The local end of every outgoing connection is drawn from the kernel's ephemeral range, and a port that
# bind(0) hands out comes from it too: between that and the child's own bind, any connection on the
# machine could take it (a test's node exited with EADDRINUSE on such a port). So ports are drawn below it,
# between the well-known servers' ports (a kubelet's 10250, etcd's 2379) and Kubernetes' NodePorts (30000-).
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT, HIGHEST_PORT = 20000, 30000
_handed_out: set[int] = set()  # never the same port twice from one process, bound yet or not


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nothing listens on now, below the ephemeral range where there is room for it."""
    top = min(_ephemeral_start(), HIGHEST_PORT)
    for _ in range(200 if top - LOWEST_PORT >= 1000 else 0):
        port = random.randrange(LOWEST_PORT, top)
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    with socket.socket() as sock:  # no room below it: the kernel's choice
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
