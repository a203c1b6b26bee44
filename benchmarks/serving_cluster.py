"""A local serving cluster for the serving benchmarks: node processes pinned to one core each with one torch
thread, and a router, started and stopped by kvferry.local_cluster.LocalCluster."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from kvferry.local_cluster import LocalCluster
from kvferry.redis_server import free_port


@dataclass(frozen=True)
class NodeSpec:
    role: str  # "prefill" or "decode"
    name: str
    core: int | None = None  # the one CPU core it may run on; None: any


def pinned(core: int | None, args: list[str]) -> list[str]:
    return args if core is None else ["taskset", "-c", str(core), *args]


class ServingCluster:
    """with ServingCluster(model, nodes, router_args) as cluster: cluster.router_url, cluster.node_urls"""

    def __init__(self, model: Path, nodes: list[NodeSpec], router_args: list[str] | None = None, num_kv_blocks: int = 1024) -> None:
        self.model, self.nodes, self.router_args, self.num_kv_blocks = model, nodes, router_args or [], num_kv_blocks
        self.local = LocalCluster()
        self.node_urls: dict[str, str] = {}
        self.router_url = ""
        self.registry_url = ""

    def __enter__(self) -> ServingCluster:
        # One intra-op thread per process: a node pinned to a core must not oversubscribe it. Children inherit it.
        os.environ["OMP_NUM_THREADS"] = "1"
        python = [sys.executable, "-m", "kvferry"]
        try:
            self.registry_url = self.local.registry(None)
            for node in self.nodes:
                port = free_port()
                self.node_urls[node.name] = f"http://127.0.0.1:{port}"
                args = [*python, node.role, "--model", str(self.model), "--name", node.name, "--registry", self.registry_url,
                        "--port", str(port), "--num-kv-blocks", str(self.num_kv_blocks)]
                self.local.spawn(node.name, pinned(node.core, args))
            port = free_port()
            router = [*python, "router", "--model", str(self.model), "--port", str(port), *self.router_args]
            for node in self.nodes:
                router += [f"--{node.role}", self.node_urls[node.name]]
            self.local.spawn("router", router)
            self.router_url = f"http://127.0.0.1:{port}"
            self.local.wait_ready({**self.node_urls, "router": self.router_url})
        except BaseException:
            self.local.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.local.stop()
