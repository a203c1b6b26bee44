"""The facts of the machine and the checkout a transfer result was measured on: its load (and a wait for it
to drop), the packages and the git state measured, and the transports UCX picked."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.harness.environment import environment
from benchmarks.transfer_peers.pair import Registry

CHECKOUT = Path(__file__).resolve().parents[2]


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def wait_for_load(limit: float, max_minutes: float, poll_s: float = 120.0) -> dict[str, Any]:
    """Poll the 1-minute load average until it drops below `limit` (other jobs share this machine)."""
    start = time.monotonic()
    seen = [loadavg()[0]]
    while seen[-1] >= limit and time.monotonic() - start < max_minutes * 60:
        print(f"load average {seen[-1]} >= {limit}; waiting {poll_s:.0f} s", flush=True)
        time.sleep(poll_s)
        seen.append(loadavg()[0])
    return {
        "limit": limit,
        "waited_s": round(time.monotonic() - start),
        "dropped_below": seen[-1] < limit,
        "seen": seen,
    }


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        result = subprocess.run(["git", *args], cwd=CHECKOUT, capture_output=True, text=True)
        return result.stdout.strip()

    # The transfer engine may be mid-change in the working tree: name the state that was measured.
    sources = hashlib.sha1()
    for path in sorted((CHECKOUT / "transfer").glob("*.py")):
        sources.update(path.name.encode() + path.read_bytes())
    return {"commit": git("rev-parse", "--short", "HEAD"), "uncommitted_in_transfer": git("status", "--short", "transfer"),
            "transfer_sources_sha1": sources.hexdigest()[:12]}  # fmt: skip


PROTO_ROW = re.compile(
    r"\|\s*(?P<range>\d[\w.]*(?:\.\.\w+)?)\s*\|\s*(?P<proto>[^|]+?)\s*\|\s*(?P<lanes>[^|]+?)\s*\|\s*$"
)


def ucx_transports(log: Path) -> dict[str, list[str]]:
    """What UCX_PROTO_INFO=y printed: for each operation ('tagged message by ucp_tag_send* from host
    memory', 'remote memory write by ucp_put* ...'), its 'range: protocol on lanes' rows, deduplicated.
    Enough to tell shared memory or CMA from tcp/lo."""
    tables: dict[str, list[str]] = {}
    title = ""
    for line in log.read_text(errors="replace").splitlines():
        if " by ucp_" in line:
            title = next(part.strip() for part in line.split("|") if " by ucp_" in part)
            tables.setdefault(title, [])
            continue
        match = PROTO_ROW.search(line)
        if title and match and match["proto"] != "Description":
            row = f"{match['range']}: {match['proto']} on {match['lanes']}"
            if row not in tables[title]:
                tables[title].append(row)
    return tables


def environment_info(registry: Registry) -> dict[str, Any]:
    return {
        **environment(),
        "cpu_count": os.cpu_count(),
        "packages": {
            name: package_version(name)
            for name in (
                "ucxx-cu13",
                "libucx-cu13",
                "nixl-cu12",
                "mooncake-transfer-engine-non-cuda",
                "numpy",
            )
        },  # fmt: skip
        "registry": registry.kind,
        "git": git_state(),
        "loopback_only": "127.0.0.1",
    }
