"""A local serving cluster for the serving benchmarks: node processes pinned to one core each with one torch
thread, and one or more routers over them, started and stopped by kvferry.cli.local_cluster.LocalCluster."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.harness.processes import http_ok, wait_until
from kvferry.cli.local_cluster import LocalCluster
from kvferry.cli.ports import free_port
from kvferry.loadgen.client import Endpoint
from kvferry.loadgen.datasets import BenchRequest
from kvferry.loadgen.runner import LoadShape, RunResult, run_load

PYTHON = [sys.executable, "-m", "kvferry"]
# A node pinned to one core of a busy shared machine can take longer than the 2 s default transfer timeout
# to answer its peer; a transfer that fails there turns a disaggregated request into a local prefill.
READY_WAIT_SECONDS = 60
NODE_ARGS = ("--num-kv-blocks", "1024", "--transfer-timeout", "30", "--lease", "60")


@dataclass(frozen=True)
class NodeSpec:
    role: str  # "prefill" or "decode"
    name: str
    core: int | None = None  # the one CPU core it may run on; None: any
    args: tuple[str, ...] = ()  # after the cluster's node_args, so these win (e.g. its own --num-kv-blocks)


@dataclass(frozen=True)
class RouterSpec:
    name: str = "router"
    args: tuple[str, ...] = ()  # e.g. ("--policy", "prefix")
    nodes: tuple[str, ...] | None = None  # the names of the nodes it routes to; None: all
    with_index: bool = False  # pass the cluster's Redis as --redis-url (the prefix index)
    core: int | None = None  # the one CPU core it may run on; None: any


def wait_until_ready(url: str) -> None:
    """A router answers 503 to everything while it has ejected its decode nodes (a starved node can miss its
    1 s health probe): a run starts once /ready says a decode node is back, or after READY_WAIT_SECONDS."""
    wait_until(lambda: http_ok(f"{url}/ready"), READY_WAIT_SECONDS)


def offer(endpoint: Endpoint, requests: list[BenchRequest], shape: LoadShape) -> RunResult:
    """One bounded run of the load generator; a run in which every request failed stops the benchmark."""
    wait_until_ready(endpoint.base_url)
    result = asyncio.run(run_load(endpoint, requests, shape))
    if all(r.error is not None for r in result.records):
        raise RuntimeError(
            f"every request failed at {shape.label}: {sorted({r.error for r in result.records})[:3]}"
        )
    return result


def counter_total(urls: list[str], name: str, labels: Mapping[str, str] | None = None) -> float:
    """A Prometheus counter's value summed over every label set (those with `labels`, when given) and every
    process at these URLs."""
    wanted = (labels or {}).items()
    total = 0.0
    for url in urls:
        for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
            total += sum(
                sample.value
                for sample in family.samples
                if sample.name == f"{name}_total" and wanted <= sample.labels.items()
            )
    return total


def pinned(core: int | None, args: list[str]) -> list[str]:
    return args if core is None else ["taskset", "-c", str(core), *args]


class ServingCluster:
    """with ServingCluster(model, nodes) as cluster: cluster.router_urls["router"], cluster.node_urls[...]"""

    def __init__(
        self,
        model: Path,
        nodes: list[NodeSpec],
        routers: list[RouterSpec] | None = None,
        node_args: tuple[str, ...] = NODE_ARGS,
    ) -> None:
        self.model, self.nodes, self.routers, self.node_args = (
            model,
            nodes,
            routers or [RouterSpec()],
            node_args,
        )
        self.local = LocalCluster()
        self.node_urls: dict[str, str] = {}
        self.router_urls: dict[str, str] = {}

    @property
    def router_url(self) -> str:
        return self.router_urls[self.routers[0].name]

    def __enter__(self) -> ServingCluster:
        # One intra-op thread per process: a node pinned to a core must not oversubscribe it. Children inherit it.
        os.environ["OMP_NUM_THREADS"] = "1"
        try:
            registry = self.local.registry(None)
            for node in self.nodes:
                port = free_port()
                self.node_urls[node.name] = f"http://127.0.0.1:{port}"
                args = [
                    *PYTHON,
                    node.role,
                    "--model",
                    str(self.model),
                    "--name",
                    node.name,
                    "--registry",
                    registry,
                    "--port",
                    str(port),
                    *self.node_args,
                    *node.args,
                ]
                self.local.spawn(node.name, pinned(node.core, args))
            for router in self.routers:
                port = free_port()
                args = [*PYTHON, "router", "--model", str(self.model), "--port", str(port), *router.args]
                if router.with_index:
                    args += ["--redis-url", registry]
                for node in self.nodes:
                    if router.nodes is None or node.name in router.nodes:
                        args += [f"--{node.role}", self.node_urls[node.name]]
                self.local.spawn(router.name, pinned(router.core, args))
                self.router_urls[router.name] = f"http://127.0.0.1:{port}"
            self.local.wait_ready({**self.node_urls, **self.router_urls})
        except BaseException:
            self.local.stop()
            raise
        return self

    def kill(self, name: str) -> None:
        """SIGKILL a node, as a crash would."""
        self.local.kill(name)

    def restart(self, name: str) -> None:
        """Start a killed node again on its port, and wait until it serves."""
        self.local.restart(name)
        self.local.wait_ready({name: self.node_urls[name]})

    def __exit__(self, *_: object) -> None:
        self.local.stop()
