"""The cluster the pods tier serves from: the chart installed with Helm, `examples/inferencecluster.yaml`
applied, and a test's view of it (the e2e tests' namespace view, plus the router and the pods' own HTTP).

One cluster serves the whole tier (installing it takes minutes): the test modules run in name order, each
leaving it as the next expects: test_real_pods.py (the main path, ending with two decode pods),
test_real_pods_faults.py (the fault matrix, ending with one), test_real_pods_teardown.py (uninstall).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import httpx
import yaml
from cluster.waiting import wait_until
from e2e.kube_cluster import Cluster
from pods.real_node import REPO, PodsNode
from pods.serving_loop import Outcomes, ServingLoop
from support.disaggregated_cluster import idle

CHART = REPO / "charts" / "kvferry"
EXAMPLE = REPO / "examples" / "inferencecluster.yaml"
NAMESPACE = "kvferry"
RELEASE = "kvferry"
CLUSTER = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
SERVED_NAME = yaml.safe_load(EXAMPLE.read_text())["spec"]["model"]["servedName"]
NODE_PORT = 8000  # the nodes' and the router's container port (the operator's pod specs)
# Pods load torch and the model on a 2-core machine that runs the tests too: minutes, not seconds.
READY_S = 900
# A node settles what a lost peer left within a lease (5 s) and a transfer timeout (2 s); a busy machine adds.
IDLE_S = 60
WORKERS = 4  # concurrent streams under load: enough that two decode pods both decode
AUTOSCALE_S = 5  # the planner's interval (the chart's default is 30): a load step is met in a test's minutes


@dataclass
class ServedCluster(Cluster):
    """The e2e tests' namespace view (kubectl, get, items, status) over the real node, plus the router."""

    kube: PodsNode  # the real node: kubectl and helm, and its container runtime

    @cached_property
    def router(self) -> str:
        """http://<the router Service's cluster IP>:<port> (the operator makes the Service)."""
        service = json.loads(self.kubectl("get", "service", f"{CLUSTER}-router", "-o", "json").stdout)
        return f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"

    def ready_pods(self, role: str) -> list[dict[str, Any]]:
        def ready(pod: dict[str, Any]) -> bool:
            conditions = pod.get("status", {}).get("conditions") or []
            deleting = pod["metadata"].get("deletionTimestamp")
            return not deleting and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        return [pod for pod in self.items("pods", f"kvferry.dev/cluster={CLUSTER},kvferry.dev/role={role}") if ready(pod)]

    def wait_ready(self, decode: int = 1) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(CLUSTER)
            ok = status.get("phase") == "Ready" and status.get("decode", {}).get("ready") == decode
            return status if ok else None

        def describe() -> str:
            pods = self.kubectl("get", "pods", "-o", "wide", check=False).stdout
            events = self.kubectl("get", "events", "--sort-by=.lastTimestamp", check=False).stdout[-3000:]
            return f"{CLUSTER} Ready with {decode} decode pods; status {self.status(CLUSTER)}\n{pods}\n{events}"

        return wait_until(describe, reached, READY_S, interval=2)

    def wait_rolled(self) -> dict[str, Any]:
        """The operator has seen the spec's last change and every role runs it: only updated pods, all Ready."""
        def reached() -> dict[str, Any] | None:
            body = self.get("inferencecluster", CLUSTER) or {}
            status = body.get("status") or {}
            caught_up = status.get("observedGeneration") == body["metadata"]["generation"]
            return status if caught_up and status.get("phase") == "Ready" else None

        return wait_until(lambda: f"{CLUSTER} rolled out; status {self.status(CLUSTER)}", reached, READY_S, interval=2)

    def scale(self, role: str, replicas: int) -> None:
        """`spec.<role>.replicas`, then wait until exactly that many of its pods are ready."""
        self.patch_spec(CLUSTER, {role: {"replicas": replicas}})
        self.wait_scaled(role, replicas)

    def wait_scaled(self, role: str, replicas: int) -> None:
        """The cluster Ready with exactly `replicas` ready pods of the role (none of them being deleted)."""
        def reached() -> bool:
            status = self.status(CLUSTER)
            return (status.get("phase") == "Ready" and status.get(role, {}).get("ready") == replicas
                    and len(self.ready_pods(role)) == replicas)

        wait_until(lambda: f"{replicas} {role} pods ready; status {self.status(CLUSTER)}", reached, READY_S, interval=2)

    def under_load(self, expected: Mapping[str, str | tuple[str, ...]], what: str, disrupt: Callable[[], None],
                   recovered: Callable[[], object], workers: int = WORKERS) -> Outcomes:
        """Streams from `workers` clients (serving_loop.py); `disrupt()` once they answer; then `recovered()`
        (it waits, or fails) and eight answers after it. Every node pod idle at the end."""
        with ServingLoop(self.router, SERVED_NAME, expected, workers=workers, max_requests=2000,
                         max_seconds=READY_S) as loop:
            wait_until(lambda: f"answers before {what}: {loop.snapshot().described()}",
                       lambda: loop.snapshot().answered >= workers, 180)
            disrupt()
            recovered()
            answered = loop.snapshot().answered
            wait_until(lambda: f"answers after {what}: {loop.snapshot().described()}",
                       lambda: loop.snapshot().answered >= answered + 8, 300)
        outcomes = loop.stop()
        print(f"{what}: {outcomes}")
        self.wait_idle()
        return outcomes

    def described(self, outcomes: Outcomes) -> str:
        """For a failed promise: the outcomes, and the router's log and the warning events."""
        return f"{outcomes.described()}\n{self.diagnosis()}"

    def metric(self, pod: dict[str, Any], name: str, **labels: str) -> float:
        """The sum of a metric's samples on one pod, read from its /metrics over the pod network: those whose
        labels include `labels` (`metric(router, "kvferry:router_migrations_total", outcome="migrated")`)."""
        text = httpx.get(f"{pod_url(pod)}/metrics", timeout=30).text
        wanted = [f'{key}="{value}"' for key, value in labels.items()]
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith((name + "{", name + " ")) and all(label in line for label in wanted))

    def stats(self, pod: dict[str, Any]) -> dict[str, Any]:
        """A node pod's /stats: what it runs, waits for, reserves and holds."""
        return httpx.get(f"{pod_url(pod)}/stats", timeout=30).json()

    def wait_idle(self) -> None:
        """Every ready prefill and decode pod holds nothing: no request, reservation, held KV, block or lease."""
        def busy() -> dict[str, dict]:
            pods = self.ready_pods("prefill") + self.ready_pods("decode")
            stats = {pod["metadata"]["name"]: self.stats(pod) for pod in pods}
            return {name: pod_stats for name, pod_stats in stats.items() if not idle(pod_stats)}

        wait_until(lambda: f"every node pod idle; busy: {busy()}", lambda: not busy(), IDLE_S, interval=1)

    def complete(self, prompt: str, max_tokens: int) -> str:
        body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        response = httpx.post(f"{self.router}/v1/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]

    def diagnosis(self) -> str:
        """For a failure's message: the router's last log lines and the namespace's warning events (a probe
        that failed, a container killed)."""
        logs = self.kubectl("logs", f"--selector=kvferry.dev/cluster={CLUSTER},kvferry.dev/role=router", "--tail=40",
                            check=False).stdout
        events = self.kubectl("get", "events", "--field-selector=type=Warning", "--sort-by=.lastTimestamp",
                              check=False).stdout
        return f"router log:\n{logs}\nwarning events:\n{events[-4000:]}"

    def container_pid(self, pod: dict[str, Any]) -> int:
        """The host's process id of the pod's (one) container: a way into its network namespace."""
        [container] = pod["status"]["containerStatuses"]
        return self.kube.container_pid(container["containerID"].removeprefix("containerd://"))


def install(node: PodsNode) -> ServedCluster:
    """`helm install` the chart, `kubectl apply` the example, and wait until it is Ready."""
    node.helm("upgrade", "--install", RELEASE, str(CHART), f"--namespace={NAMESPACE}", "--create-namespace",
              "--set", f"operator.autoscaleSeconds={AUTOSCALE_S}", "--wait", "--timeout=10m")
    cluster = ServedCluster(node, NAMESPACE)
    cluster.kubectl("apply", "-f", str(EXAMPLE))
    cluster.wait_ready()
    return cluster


def pod_url(pod: dict[str, Any]) -> str:
    """A node or router pod's own HTTP address on the pod network."""
    return f"http://{pod['status']['podIP']}:{NODE_PORT}"
