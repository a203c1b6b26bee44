"""The three transfer engines under test, each behind the same small interface.

A pair of processes runs one system: the target owns the destination buffer, the initiator owns the
source buffer and times `batch_transfer_write`-style calls into the target. Each system's import is
deferred to its own class, so a missing NIXL or Mooncake wheel costs only that system's column.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from benchmarks.transfer_peers.workload import Batch, address

# A batch that has not finished by then is an error, not a number (the machine may be loaded).
DEADLINE_SECONDS = 60.0
# kvferry's target buffer: "managed" (allocate_managed_buffer, as the decode node's CPU pool) or
# "registered" (the benchmark's own memory, register_memory); an A/B sets it per variant.
TARGET_MEMORY_ENV = "KVFERRY_BENCH_TARGET_MEMORY"


class System(Protocol):
    def setup(self, name: str, role: str, buffer: np.ndarray, options: dict[str, Any]) -> dict[str, Any]:
        """Start the engine over `buffer`; returns what the other side needs to reach it."""
        ...

    def connect(self, remote: dict[str, Any]) -> None: ...

    def run(self, batch: Batch, runs: int, options: dict[str, Any]) -> list[float]:
        """Write `batch` into the target `runs` times; seconds per batch."""
        ...

    def close(self) -> None: ...


class FileRegistry:
    """kvferry's PeerRegistry over one JSON file per name, for machines without redis-server."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def publish(self, name: str, record: dict[str, object]) -> None:
        path = self.folder / f"{name}.json"
        path.with_suffix(".tmp").write_text(json.dumps(record))
        path.with_suffix(".tmp").replace(path)  # readers never see half a record

    def lookup(self, name: str) -> dict[str, object] | None:
        path = self.folder / f"{name}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def remove(self, name: str) -> None:
        (self.folder / f"{name}.json").unlink(missing_ok=True)


class Kvferry:
    def setup(self, name: str, role: str, buffer: np.ndarray, options: dict[str, Any]) -> dict[str, Any]:
        from kvferry.transfer import TransferConfig, TransferEngine

        registry: Any = options["registry"]
        if registry.startswith("file:"):
            registry = FileRegistry(registry.removeprefix("file:"))
        # A generous deadline: on a loaded 2-core machine a slow batch should show up as a slow number.
        self.engine = TransferEngine(TransferConfig(timeout_seconds=DEADLINE_SECONDS))
        self.engine.initialize(name, registry, "ucx")
        if role == "target" and os.environ.get(TARGET_MEMORY_ENV, "managed") == "managed":
            # As the decode node's CPU pool: memory the engine allocated (shared memory on one host).
            managed = self.engine.allocate_managed_buffer(buffer.nbytes)
            self.buffer = np.ctypeslib.as_array((ctypes.c_ubyte * buffer.nbytes).from_address(managed))
            self.buffer[:] = buffer
        else:
            self.engine.register_memory(address(buffer), buffer.nbytes)
            self.buffer = buffer
        self.base = address(self.buffer)
        return {"name": name, "base": self.base}

    def connect(self, remote: dict[str, Any]) -> None:
        self.target, self.remote_base = remote["name"], remote["base"]
        self.engine.handshake(self.target)

    def run(self, batch: Batch, runs: int, options: dict[str, Any]) -> list[float]:
        from kvferry.transfer.engine import MAX_RANGES_PER_BATCH

        if options.get("coalesce"):
            chunks = [self._connector_runs(batch)]
        else:
            src, dst, lengths = batch.descriptors(self.base, self.remote_base)
            step = MAX_RANGES_PER_BATCH  # a larger batch goes as several calls in flight at once
            chunks = [
                (src[i : i + step], dst[i : i + step], lengths[i : i + step])
                for i in range(0, len(src), step)
            ]
        latencies = []
        for _ in range(runs):
            start = time.perf_counter()
            futures = [self.engine.batch_transfer_write_async(self.target, *chunk) for chunk in chunks]
            for future in futures:
                future.result(timeout=DEADLINE_SECONDS)
            latencies.append(time.perf_counter() - start)
        return latencies

    def _connector_runs(self, batch: Batch) -> tuple[list[int], list[int], list[int]]:
        """The ranges KVSender.send_blocks would send: block runs consecutive on both sides, coalesced."""
        from kvferry.transfer.kv_connector import coalesce_block_runs

        runs = coalesce_block_runs(list(range(batch.count)), batch.slots().tolist())
        size = batch.block_bytes
        return (
            [self.base + s * size for s, _, _ in runs],
            [self.remote_base + d * size for _, d, _ in runs],
            [n * size for _, _, n in runs],
        )

    def close(self) -> None:
        self.engine.close()


def _import_nixl() -> Any:
    # The wheel `nixl-cu12` provides `nixl_cu12`; the meta package `nixl` re-exports it as `nixl`.
    try:
        import nixl_cu12 as nixl
    except ImportError as first:
        try:
            import nixl._api as nixl  # type: ignore[no-redef]
        except ImportError as second:
            raise ImportError(f"neither nixl_cu12 ({first}) nor nixl ({second}) imports") from second
    return nixl


class Nixl:
    def setup(self, name: str, role: str, buffer: np.ndarray, options: dict[str, Any]) -> dict[str, Any]:
        nixl = _import_nixl()
        self.agent = nixl.nixl_agent(name, nixl.nixl_agent_config(backends=["UCX"]))
        self.base = address(buffer)
        self.agent.register_memory([(self.base, buffer.nbytes, 0, "")], "DRAM")
        self.prepared: dict[tuple[int, int, int | None], tuple[Any, Any, list[int]]] = {}
        return {"name": name, "base": self.base, "metadata": self.agent.get_agent_metadata().hex()}

    def connect(self, remote: dict[str, Any]) -> None:
        # Both sides load each other's metadata, as NIXL's own two-process examples do.
        self.remote = self.agent.add_remote_agent(bytes.fromhex(remote["metadata"]))
        self.remote_base = remote["base"]

    def _prepare(self, batch: Batch) -> tuple[Any, Any, list[int]]:
        """Descriptor lists prepared once per layout, outside the timing, as vLLM's NIXL connector does at
        registration; each batch then picks (local block, remote slot) pairs by index."""
        key = (batch.block_bytes, batch.count, batch.seed)
        if key not in self.prepared:
            size = batch.block_bytes
            local = [(self.base + i * size, size, 0) for i in range(batch.count)]
            remote = [(self.remote_base + i * size, size, 0) for i in range(batch.count)]
            self.prepared[key] = (
                self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", local, "DRAM"),
                self.agent.prep_xfer_dlist(self.remote, remote, "DRAM"),
                batch.slots().tolist(),
            )
        return self.prepared[key]

    def run(self, batch: Batch, runs: int, options: dict[str, Any]) -> list[float]:
        local, remote, slots = self._prepare(batch)
        indices = list(range(batch.count))
        latencies = []
        for _ in range(runs):
            start = time.perf_counter()
            handle = self.agent.make_prepped_xfer("WRITE", local, indices, remote, slots)
            state = self.agent.transfer(handle)
            deadline = time.monotonic() + DEADLINE_SECONDS
            while state == "PROC" and time.monotonic() < deadline:
                state = self.agent.check_xfer_state(handle)
            self.agent.release_xfer_handle(handle)
            latencies.append(time.perf_counter() - start)
            if state != "DONE":
                raise RuntimeError(f"NIXL transfer ended in state {state}")
        return latencies

    def close(self) -> None:
        del self.agent


class MooncakeTcp:
    def setup(self, name: str, role: str, buffer: np.ndarray, options: dict[str, Any]) -> dict[str, Any]:
        from mooncake.engine import TransferEngine

        self.engine = TransferEngine()
        # P2PHANDSHAKE: no metadata server; a peer is named by "host:rpc_port" and handshakes directly.
        if self.engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            raise RuntimeError("Mooncake TransferEngine.initialize failed")
        self.base = address(buffer)
        if self.engine.register_memory(self.base, buffer.nbytes) != 0:
            raise RuntimeError("Mooncake register_memory failed")
        return {"name": name, "base": self.base, "session": f"127.0.0.1:{self.engine.get_rpc_port()}"}

    def connect(self, remote: dict[str, Any]) -> None:
        self.session, self.remote_base = remote["session"], remote["base"]

    def run(self, batch: Batch, runs: int, options: dict[str, Any]) -> list[float]:
        src, dst, lengths = batch.descriptors(self.base, self.remote_base)
        latencies = []
        for _ in range(runs):
            start = time.perf_counter()
            status = self.engine.batch_transfer_sync_write(self.session, src, dst, lengths)
            latencies.append(time.perf_counter() - start)
            if status != 0:
                raise RuntimeError(f"Mooncake batch_transfer_sync_write returned {status}")
        return latencies

    def close(self) -> None:
        del self.engine


SYSTEMS: dict[str, type] = {"kvferry": Kvferry, "nixl": Nixl, "mooncake_tcp": MooncakeTcp}
