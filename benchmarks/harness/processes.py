"""Child processes of a benchmark: started with their output in a log, waited on until they serve, stopped."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import httpx


def start_logged(
    argv: list[str], log: Path, env: Mapping[str, str] | None = None, pass_fds: Collection[int] = ()
) -> subprocess.Popen[bytes]:
    """A child whose stdout and stderr go to `log` (read back when it fails), stdin closed."""
    with log.open("wb") as sink:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            pass_fds=tuple(pass_fds),
            env=env,
        )


def wait_until(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.5) -> bool:
    """Whether `check` came true within timeout_s, tried every interval_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def http_ok(url: str) -> bool:
    """Whether `url` answers 200 now (a server still starting, or refusing, is not ok)."""
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def stop(process: subprocess.Popen[bytes], grace_s: float = 10.0) -> int | None:
    """Waits up to grace_s for a child asked to quit, then kills it (only this child); its exit status."""
    try:
        return process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process, from /proc (Linux): other jobs on a shared machine stretch
    wall times far more than they move CPU times."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
