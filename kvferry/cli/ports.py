"""Free loopback ports for child processes (kvferry up, tests, benchmarks)."""

from __future__ import annotations

import random
import socket
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
