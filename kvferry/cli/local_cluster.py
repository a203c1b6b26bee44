"""`kvferry up`: a whole cluster on this machine, each node its own process, stopped together."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from kvferry.cli.ports import free_port
from kvferry.cli.redis_server import RedisServer
from kvferry.router.admission.auth import CLUSTER_TOKEN_ENV

READY_TIMEOUT_SECONDS = 180
STOP_GRACE_SECONDS = 8


class LocalCluster:
    def __init__(self, cluster_token: str | None = None) -> None:
        """`cluster_token`: every process gets it (nodes require it on their internal API, the router sends it)."""
        self.processes: list[tuple[str, subprocess.Popen]] = []
        self.commands: dict[str, list[str]] = {}  # each process's command line, for restart
        self.workdir = Path(tempfile.mkdtemp(prefix="kvferry-up-"))
        self.redis: RedisServer | None = None
        # In the environment, not in argv, where `ps` would show it to every user of the machine.
        self.env = {**os.environ, CLUSTER_TOKEN_ENV: cluster_token} if cluster_token else None

    def spawn(self, name: str, args: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "a")  # noqa: SIM115 - kept open for the child's lifetime
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
        self.processes.append((name, process))
        self.commands[name] = args

    def kill(self, name: str) -> None:
        """SIGKILL one process (and its children), as a crash would; it is gone on purpose, so neither
        wait_ready nor stop takes its exit for a failure."""
        process = dict(self.processes)[name]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        self.processes.remove((name, process))

    def restart(self, name: str) -> None:
        """Start a killed process again with its command line (same port: whoever called it finds it back)."""
        self.spawn(name, self.commands[name])

    def registry(self, redis_url: str | None) -> str:
        if redis_url:
            return redis_url
        if shutil.which("redis-server") is None:
            print(
                "redis-server not found: nodes find each other through a registry folder instead, and the router "
                "routes without the shared prefix index (by load only)"
            )
            return f"file://{self.workdir / 'registry'}"
        self.redis = RedisServer(self.workdir, log=self.workdir / "redis.log")
        print(f"  redis-server on {self.redis.url}")
        return self.redis.url

    def wait_ready(self, urls: dict[str, str]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        pending = dict(urls)
        while pending:
            for name, process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode}; see {self.workdir / (name + '.log')}")
            for name, url in list(pending.items()):
                try:
                    if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                        print(f"  {name} ready at {url}")
                        del pending[name]
                except httpx.HTTPError:
                    pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready after {READY_TIMEOUT_SECONDS}s: {', '.join(pending)}")
            time.sleep(0.5)

    def stop(self) -> None:
        """SIGTERM everything (router first), give them STOP_GRACE_SECONDS together, then SIGKILL."""
        for _, process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for _, process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if self.redis is not None:
            self.redis.stop()

    def remove_workdir(self) -> None:
        """Delete the logs and registry folder, once everything is stopped. `kvferry up` keeps them for whoever
        reads the logs after Ctrl-C; a test harness, which reads them while the cluster runs, removes them
        (one folder per cluster otherwise piles up in /tmp, a hundred an hour in a loop of the e2e tier)."""
        shutil.rmtree(self.workdir, ignore_errors=True)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def run_local_cluster(model: str | None, num_prefill: int, num_decode: int, redis_url: str | None, port: int) -> int:
    # Installed explicitly: a shell that starts us in the background hands SIGINT down as ignored, and
    # Python then never turns Ctrl-C into KeyboardInterrupt.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    from kvferry.engine.model_source import DEFAULT_MODEL, MODEL_SOURCE_ERRORS, resolve_model

    try:  # once, here: every node and the router get the folder
        model_dir = resolve_model(model or DEFAULT_MODEL)
    except MODEL_SOURCE_ERRORS as exc:
        print(f"kvferry up: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C while fetching or importing: the cache keeps nothing half-written
        return 130
    cluster = LocalCluster(cluster_token=secrets.token_urlsafe(32))  # one per cluster, never printed
    python = [sys.executable, "-m", "kvferry"]
    try:
        registry = cluster.registry(redis_url)
        urls: dict[str, str] = {}
        for role, count in (("prefill", num_prefill), ("decode", num_decode)):
            for index in range(count):
                name, node_port = f"{role}-{index}", free_port()
                urls[name] = f"http://127.0.0.1:{node_port}"
                cluster.spawn(name, [*python, role, "--model", str(model_dir), "--name", name, "--registry", registry, "--port", str(node_port)])
        print(f"starting {num_prefill} prefill and {num_decode} decode nodes (logs in {cluster.workdir})")
        cluster.wait_ready(urls)
        # The router starts once its nodes answer, so that its first requests already find them healthy.
        # The router reads node load from the registry, and the prefix index from Redis when there is one.
        source = "--redis-url" if registry.startswith("redis://") else "--registry"
        router = [*python, "router", "--model", str(model_dir), "--port", str(port), source, registry]
        for name, url in urls.items():
            router += ["--prefill" if name.startswith("prefill") else "--decode", url]
        cluster.spawn("router", router)
        cluster.wait_ready({"router": f"http://127.0.0.1:{port}"})
        print(f"\nkvferry is up at http://127.0.0.1:{port}  (model {model_dir.name}; Ctrl-C stops everything)\n")
        print(f"  curl http://127.0.0.1:{port}/v1/chat/completions -H 'Content-Type: application/json' \\")
        print(f"    -d '{{\"model\": \"{model_dir.name}\", \"messages\": [{{\"role\": \"user\", "
              f"\"content\": \"What is the capital of France?\"}}], \"max_tokens\": 32}}'\n")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        print("stopping kvferry")
        cluster.stop()
