"""The benchmark's side of a pair of peer processes (benchmarks.transfer_peers.peer): starting a target and
an initiator of one system, driving them over pipes, timing batches between them, and stopping them; and
the registry the peers find each other through."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness.processes import start_logged, stop
from benchmarks.transfer_peers.measurement import Measurement
from benchmarks.transfer_peers.workload import Batch
from kvferry.cli.redis_server import RedisServer

CHECKOUT = Path(__file__).resolve().parents[2]
PEER = "benchmarks.transfer_peers.peer"
PEER_TIMEOUT_S = 180.0  # one command of a peer; a 64 MiB batch at 0.1 GB/s is well inside
# Mooncake's TCP transport refuses a batch deeper than its per-peer queue (here 2048 descriptors pass and
# 3000 fail with "TCP lane queue-full rejection" and status -1, so 4096 x 16 KiB fails); its own knob
# lets the same single batch through.
# kvferry's target holds its buffer in memory the engine allocated, as a decode node's CPU pool does
# (docs/transfer.md, item 9); named here so that the results file records it.
SYSTEM_ENV = {
    "mooncake_tcp": {"MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER": "8192"},
    "kvferry": {"KVFERRY_BENCH_TARGET_MEMORY": "managed"},
}


class PeerError(RuntimeError):
    pass


@dataclass
class Peer:
    """A peer process (benchmarks.transfer_peers.peer) and the two pipes that drive it."""

    process: subprocess.Popen[bytes]
    commands: Any
    replies: Any
    log: Path
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(
        cls, system: str, role: str, buffer_bytes: int, registry: str, log: Path, env: dict[str, str]
    ) -> Peer:
        cmd_read, cmd_write = os.pipe()
        reply_read, reply_write = os.pipe()
        # UCX prints the protocol and transports each endpoint picked; read back from the log afterwards.
        env = {"UCX_PROTO_INFO": "y", **env, **os.environ}  # what the caller exported wins
        # The peer is a module of this checkout's benchmarks package. -P keeps the working directory off its
        # sys.path, so a PYTHONPATH that transfer_ab.py points at another tree provides kvferry (and that
        # tree's benchmarks package, where it has one); this checkout comes after it.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(CHECKOUT)]))
        argv = [sys.executable, "-P", "-m", PEER, "--system", system, "--role", role, "--name", f"{system}-{role}",
                "--buffer-bytes", str(buffer_bytes), "--cmd-fd", str(cmd_read), "--reply-fd", str(reply_write),
                "--registry", registry]  # fmt: skip
        process = start_logged(argv, log, env, pass_fds=(cmd_read, reply_write))
        os.close(cmd_read)
        os.close(reply_write)
        peer = cls(process, os.fdopen(cmd_write, "w"), os.fdopen(reply_read, "r"), log)
        peer.info = peer._reply(PEER_TIMEOUT_S)["info"]
        return peer

    def call(self, cmd: str, timeout: float = PEER_TIMEOUT_S, **fields: Any) -> dict[str, Any]:
        try:
            self.commands.write(json.dumps({"cmd": cmd, **fields}) + "\n")
            self.commands.flush()
        except BrokenPipeError as exc:
            raise PeerError(f"{self.log.stem} exited ({self.tail()})") from exc
        return self._reply(timeout)

    def _reply(self, timeout: float) -> dict[str, Any]:
        ready, _, _ = select.select([self.replies], [], [], timeout)
        line = self.replies.readline() if ready else ""
        if not line:
            raise PeerError(f"{self.log.stem} gave no answer within {timeout:.0f} s ({self.tail()})")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise PeerError(f"{self.log.stem}: {reply.get('error')}")
        return reply

    def tail(self, lines: int = 3) -> str:
        text = self.log.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "no output"

    def stop(self) -> None:
        try:
            if self.process.poll() is None:
                self.call("quit", timeout=10)
        except (PeerError, OSError, ValueError):
            pass
        stop(self.process)


@dataclass
class Pair:
    target: Peer
    initiator: Peer

    @classmethod
    def start(cls, system: str, buffer_bytes: int, registry: str, logs: Path) -> Pair:
        env = SYSTEM_ENV.get(system, {})
        target = Peer.start(system, "target", buffer_bytes, registry, logs / f"{system}-target.log", env)
        try:
            initiator = Peer.start(
                system, "initiator", buffer_bytes, registry, logs / f"{system}-initiator.log", env
            )
        except BaseException:
            target.stop()
            raise
        pair = cls(target, initiator)
        try:
            initiator.call("connect", remote=target.info)
            target.call("connect", remote=initiator.info)
        except BaseException:
            pair.stop()
            raise
        return pair

    def stop(self) -> None:
        self.initiator.stop()
        self.target.stop()

    def measure(
        self, batch: Batch, runs: int, warmup: int, expected: str, coalesce: bool = False
    ) -> Measurement:
        """Clear the destination, warm up, check the checksum, then time `runs` batches."""
        self.target.call("clear")
        self.initiator.call("run", batch=batch.to_json(), runs=warmup, coalesce=coalesce)
        arrived = self.target.call("digest", nbytes=batch.nbytes)["digest"]
        if arrived != expected:
            raise PeerError(f"destination checksum {arrived} != expected {expected} for {batch}")
        latencies = self.initiator.call("run", batch=batch.to_json(), runs=runs, coalesce=coalesce)[
            "latencies"
        ]
        return Measurement.of(batch.nbytes, latencies, verified=True)


class Registry:
    """kvferry's peers find each other through Redis as in production (a redis-server started here on
    a free loopback port), or through files when redis-server is not installed."""

    def __init__(self, workdir: Path) -> None:
        self.server: RedisServer | None = None
        if shutil.which("redis-server") is None:
            self.url, self.kind = f"file:{workdir}", "files (redis-server not installed)"
            return
        self.server = RedisServer(workdir)
        self.url, self.kind = self.server.url, "redis-server on loopback"

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
