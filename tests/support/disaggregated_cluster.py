"""A disaggregated cluster of real processes for fault and GPU tests: its own redis-server (so a test
can stop and restart it) or a registry folder, prefill and decode nodes with short leases and timeouts,
and the router.

Built on kvferry.cli.local_cluster.LocalCluster (what `kvferry up` runs), with each process addressable
by name so that a test can kill one.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from kvferry.cli.local_cluster import LocalCluster
from kvferry.cli.ports import free_port
from kvferry.cli.redis_server import RedisServer

MODEL_NAME = "llama"  # the served name of the tiny checkpoint (its folder's name)
LEASE_SECONDS = 2.0
TRANSFER_TIMEOUT_SECONDS = 1.0
# A lease, a transfer timeout and a little: by then an abort, an expired lease or held KV has settled.
SETTLE_SECONDS = LEASE_SECONDS + TRANSFER_TIMEOUT_SECONDS + 2.0
# What surviving nodes still held when their cluster stopped, one entry per leaking cluster.
LEAKS: list[dict[str, dict]] = []
# A router learns of a node's death from its probes (every 2 s); under load it may take a few rounds.
ROUTER_NOTICE_SECONDS = 30.0


@contextlib.contextmanager
def reservation(decode_url: str, body: dict, headers: dict | None = None) -> Iterator[dict]:
    """A decode node's /decode stream held open, as the router holds it while the prefill node works:
    yields its first line (the reservation's handle); leaving closes the stream, as a router that left."""
    with httpx.stream("POST", f"{decode_url}/internal/v1/decode", json=body, headers=headers, timeout=10) as response:
        assert response.status_code == 200, response.read()
        # Kept while the caller works: a line iterator dropped early closes the connection (httpcore's
        # stream closes its response when its iteration is interrupted), as a router leaving would.
        lines = response.iter_lines()
        yield json.loads(next(lines))


def idle(stats: dict) -> bool:
    """A node's /stats say it holds nothing: no request, reservation, held KV, block in use or lease."""
    return (
        stats["running"] == 0
        and stats["waiting"] == 0
        and stats["reserved"] == 0
        and stats["held_kv"] == 0
        and stats["blocks"]["in_use"] == 0
        and stats.get("leases", 0) == 0
        and stats.get("handles", 0) == 0
    )


class DisaggregatedCluster:
    def __init__(
        self,
        model_dir: Path,
        num_prefill: int = 1,
        num_decode: int = 1,
        launchers: dict[str, list[str]] | None = None,
        router_flags: list[str] | None = None,
        role_flags: dict[str, list[str]] | None = None,
        use_redis: bool = True,
        redis_down_at_start: bool = False,
        cluster_token: str | None = None,
        node_scheme: str = "http",
    ) -> None:
        """`launchers` replaces `-m kvferry` for the named processes (a fault-injecting wrapper); `role_flags`
        adds flags to every node of a role; without Redis the nodes share a registry folder and the
        router routes without the prefix index; `redis_down_at_start` starts everything while the Redis
        they are given is down (`restart_redis` brings it up on its port); `cluster_token` goes to every
        process, as `kvferry up` does. `node_scheme` https: nodes that `role_flags` give certificates (this
        process must then trust their CA, e.g. by SSL_CERT_FILE, to see them ready)."""
        self.local = LocalCluster(cluster_token)
        self.redis = RedisServer(self.local.workdir, log=self.local.workdir / "redis.log") if use_redis else None
        if self.redis is not None and redis_down_at_start:
            self.redis.stop()
        self.registry = self.redis.url if self.redis else f"file://{self.local.workdir / 'registry'}"
        self.urls: dict[str, str] = {}
        self.launchers = launchers = launchers or {}
        python = [sys.executable, "-m", "kvferry"]
        for role, count in (("prefill", num_prefill), ("decode", num_decode)):
            for index in range(count):
                name, port = f"{role}-{index}", free_port()
                self.urls[name] = f"{node_scheme}://127.0.0.1:{port}"
                launcher = [sys.executable, *launchers[name]] if name in launchers else python
                self.local.spawn(name, [
                    *launcher, role, "--model", str(model_dir), "--name", name, "--registry", self.registry,
                    "--port", str(port), "--lease", str(LEASE_SECONDS), "--transfer-timeout", str(TRANSFER_TIMEOUT_SECONDS),
                    *(role_flags or {}).get(role, []),
                ])
        self.model_dir = model_dir
        try:
            self.local.wait_ready(dict(self.urls))
            self.add_router("router", list(self.urls), router_flags or [])
        except BaseException:
            self.stop()
            raise

    def add_router(self, name: str, nodes: list[str], flags: list[str], scheme: str = "http") -> str:
        """Start a router over the named nodes; returns its URL (`https` for one given a certificate: this
        process must then trust its CA, e.g. by SSL_CERT_FILE, to see it ready)."""
        port = free_port()
        args = [
            sys.executable, *self.launchers.get(name, ["-m", "kvferry"]), "router", "--model", str(self.model_dir), "--port", str(port),
            "--redis-url" if self.redis else "--registry", self.registry, *flags,
        ]
        for node in nodes:
            args += ["--prefill" if node.startswith("prefill") else "--decode", self.urls[node]]
        self.local.spawn(name, args)
        self.urls[name] = f"{scheme}://127.0.0.1:{port}"
        self.local.wait_ready({name: self.urls[name]})
        return self.urls[name]

    @property
    def router(self) -> str:
        return self.urls["router"]

    def log(self, name: str) -> str:
        """Everything a process of the cluster wrote (stdout and stderr)."""
        return (self.local.workdir / f"{name}.log").read_text()

    def stats(self, name: str) -> dict:
        return httpx.get(f"{self.urls[name]}/stats", timeout=5).json()

    def metric(self, name: str, metric: str) -> float:
        """Sum of a Prometheus sample family of one node, or of the router (name "router"); counters: their
        `_total` samples."""
        url = self.router if name == "router" else self.urls[name]
        text = httpx.get(f"{url}/metrics", timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(metric) and not line.startswith("#"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def send_signal(self, name: str, signum: int) -> None:
        os.kill(dict(self.local.processes)[name].pid, signum)

    def exited(self, name: str) -> bool:
        """The process has ended (a signal it was sent, a drain that finished)."""
        return dict(self.local.processes)[name].poll() is not None

    def kill(self, name: str) -> None:
        self.local.kill(name)

    def wait_until_router_ejects(self, node: str, router: str = "router") -> None:
        """Until the router's own view (its /stats) marks `node` unhealthy."""

        def ejected() -> bool:
            views = httpx.get(f"{self.urls[router]}/stats", timeout=5).json()["nodes"]
            return any(view["url"] == self.urls[node] and not view["healthy"] for view in views)

        self.wait_until(ejected, ROUTER_NOTICE_SECONDS, f"{router} sees {node} unhealthy")

    def restart_redis(self) -> None:
        assert self.redis is not None, "this cluster runs without Redis"
        port = self.redis.port
        self.redis.stop()
        self.redis = RedisServer(self.local.workdir, log=self.local.workdir / "redis-restarted.log", port=port)

    def wait_until(self, check: Callable[[], object], timeout: float, what: str | Callable[[], str]) -> object:
        """Poll `check` until it returns something true; `what` (or what it returns) explains a timeout."""
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout}s: {what() if callable(what) else what}")
            time.sleep(0.1)

    def busy_nodes(self, timeout: float = SETTLE_SECONDS) -> dict[str, dict]:
        """The surviving nodes that still hold something after `timeout` (a lease, held KV and aborts
        settle within a lease and a transfer timeout), with their /stats: {} when every one is idle."""
        alive = [name for name, process in self.local.processes if name in self.urls and process.poll() is None
                 and name.startswith(("prefill", "decode"))]
        deadline = time.monotonic() + timeout
        while True:
            busy = {name: stats for name in alive if not idle(stats := self.stats(name))}
            if not busy or time.monotonic() > deadline:
                return busy
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop every process; what a surviving node still held is recorded in LEAKS first (the e2e tier's
        autouse fixture fails the test that leaked), not raised here, where it would hide a test's own error."""
        try:
            busy = self.busy_nodes()
        except httpx.HTTPError as exc:  # a node that stopped answering is the test's failure to report
            busy = {"unreachable": {"error": repr(exc)}}
        if busy:
            LEAKS.append(busy)
        self.local.stop()
        if self.redis is not None:
            self.redis.stop()
        self.local.remove_workdir()
