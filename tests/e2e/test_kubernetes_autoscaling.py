"""The autoscaling loop (operator/autoscaler.py) on the real control plane: a decision becomes the status,
an Event and the Deployment's count; a spec without autoscaling is left alone; a role scaled by another
controller (scaleExternally) keeps the count that controller set.

kwok's pods serve nothing, so the metrics the loop scrapes come from the routers' and nodes' own metric
objects (RouterMetrics, NodeMetrics) in this process, handed to the loop by pod address (a stand-in for
the pods' HTTP, named so); the clock is the test's, so an interval is as long as the test says. The
planner's own behaviour is tests/unit/test_operator_planner.py's; serving pods that scale under real load
are the pods tier's."""

from __future__ import annotations

from typing import Any

from cluster.waiting import wait_until
from e2e.example_cluster import NAME, example
from e2e.kube_cluster import Cluster
from prometheus_client import generate_latest

from kvferry.node.metrics import NodeMetrics
from kvferry.operator.autoscaler import Autoscaler
from kvferry.operator.connection import load_configuration
from kvferry.operator.kube import Kube
from kvferry.operator.reconcile import ReconcileSettings, reconcile
from kvferry.router.metrics import RouterMetrics

INTERVAL_S = 30.0
# The operator process runs for its reconciles and status; its own autoscaler would scrape kwok's pods,
# which serve nothing, so it waits an hour: this test drives an Autoscaler of its own.
QUIET_AUTOSCALER = "--autoscale-seconds=3600"


class PodMetrics:
    """Each pod's /metrics text by its address: the router's from one RouterMetrics, every decode node's
    from a NodeMetrics of its own (a stand-in for kwok's pods, which serve nothing)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.router = RouterMetrics()
        self.decode: dict[str, NodeMetrics] = {}

    def fetch(self, urls: list[str]) -> list[str]:
        roles = {pod["status"].get("podIP"): pod["metadata"]["labels"]["kvferry.dev/role"]
                 for pod in self.cluster.items("pods", f"kvferry.dev/cluster={NAME}")}
        texts = []
        for url in urls:
            address = url.split("//")[1].split(":")[0]
            role = roles[address]
            if role == "router":
                texts.append(self.router.exposition().decode())
            elif role == "decode":
                node = self.decode.setdefault(address, NodeMetrics("decode", address))
                texts.append(generate_latest(node.registry).decode())
            else:
                texts.append(generate_latest(NodeMetrics(role, address).registry).decode())
        return texts

    def decode_busy(self, running_per_node: int, gap_s: float, gaps: int) -> None:
        for node in self.decode.values():
            node.running.set(running_per_node)
            node.kv_usage.set(0.3)
        self.router.itl.observe_many([gap_s] * gaps)


def _autoscaled(cluster: Cluster) -> dict[str, Any]:
    manifest = example()
    manifest["spec"]["decode"]["replicas"] = 1
    manifest["spec"]["decode"]["autoscaling"] = {
        "minReplicas": 1, "maxReplicas": 4, "itlP90Seconds": 0.05, "scaleUpCooldownSeconds": 0,
    }
    cluster.apply(manifest)
    return manifest


def _decode_count(cluster: Cluster) -> int:
    return cluster.get("deployment", f"{NAME}-decode")["spec"]["replicas"]


def test_a_decision_sets_the_status_an_event_and_the_deployment(cluster: Cluster, start_operator) -> None:
    start_operator(QUIET_AUTOSCALER)
    _autoscaled(cluster)
    kube = Kube(load_configuration(cluster.kube.kubeconfig))
    cluster.wait_phase(NAME, "Ready")
    pods = PodMetrics(cluster)
    now = [0.0]
    autoscaler = Autoscaler(kube, (cluster.namespace,), ReconcileSettings(), fetch=pods.fetch, clock=lambda: now[0])

    def interval(gap_s: float, running: int) -> dict[str, Any]:
        pods.decode_busy(running, gap_s, gaps=200)
        now[0] += INTERVAL_S
        autoscaler.run_once()
        return cluster.status(NAME)

    autoscaler.run_once()  # the first scrape: it bounds no interval, decides nothing
    assert "autoscaling" not in cluster.status(NAME)
    idle = interval(0.018, 4)  # near the floor: the planner learns it and keeps the count
    assert idle["autoscaling"]["decode"]["replicas"] == 1
    assert "lastScaleTime" not in idle["autoscaling"]["decode"]
    busy = interval(0.2, 40)  # four times the target
    decided = busy["autoscaling"]["decode"]
    assert decided["replicas"] > 1 and decided["reason"].startswith("scale up 1 -> ")
    assert decided["lastScaleTime"]
    assert _decode_count(cluster) == decided["replicas"]
    assert busy["decode"]["desired"] == decided["replicas"]
    events = [event for event in cluster.items("events") if event["reason"] == "Autoscaled"]
    assert [event["message"] for event in events] == [f"decode: {decided['reason']}"]
    # the next reconcile (a resync, a spec edit) keeps the planner's count, not the spec's 1
    reconcile(kube, cluster.get("inferencecluster", NAME), ReconcileSettings())
    assert _decode_count(cluster) == decided["replicas"]
    assert cluster.status(NAME)["autoscaling"]["decode"]["replicas"] == decided["replicas"]


def test_turning_autoscaling_off_gives_the_count_back_to_the_spec(cluster: Cluster, start_operator) -> None:
    start_operator(QUIET_AUTOSCALER)
    manifest = _autoscaled(cluster)
    kube = Kube(load_configuration(cluster.kube.kubeconfig))
    cluster.wait_phase(NAME, "Ready")
    pods = PodMetrics(cluster)
    now = [0.0]
    autoscaler = Autoscaler(kube, (cluster.namespace,), ReconcileSettings(), fetch=pods.fetch, clock=lambda: now[0])
    for gap_s, running in ((None, 0), (0.018, 4), (0.2, 40)):
        if gap_s is not None:
            pods.decode_busy(running, gap_s, gaps=200)
        now[0] += INTERVAL_S
        autoscaler.run_once()
    assert _decode_count(cluster) > 1
    del manifest["spec"]["decode"]["autoscaling"]
    cluster.apply(manifest)  # the operator reconciles the new spec
    wait_until("the spec's count back on the Deployment", lambda: _decode_count(cluster) == 1, timeout=60)
    wait_until("the planner's decision to leave the status",
               lambda: "autoscaling" not in cluster.status(NAME), timeout=30)
    now[0] += INTERVAL_S
    autoscaler.run_once()  # nothing to scale any more: no decision comes back
    assert "autoscaling" not in cluster.status(NAME) and _decode_count(cluster) == 1


def _count(cluster: Cluster, role: str) -> int:
    return cluster.get("deployment", f"{NAME}-{role}")["spec"]["replicas"]


def test_a_role_scaled_externally_keeps_the_count_another_controller_set(cluster: Cluster, start_operator) -> None:
    """What an HPA or KEDA does, by hand: `kubectl scale` (the Deployment's /scale subresource). The operator's
    reconciles keep the count of a role with scaleExternally and the status follows it; a role without it gets
    the spec's count back."""
    start_operator(QUIET_AUTOSCALER)
    manifest = example()
    manifest["spec"]["prefill"] = {**manifest["spec"]["prefill"], "replicas": 1, "scaleExternally": True}
    cluster.apply(manifest)
    cluster.wait_phase(NAME, "Ready")
    spec_decode = _count(cluster, "decode")
    kube = Kube(load_configuration(cluster.kube.kubeconfig))
    for role in ("prefill", "decode"):
        cluster.kubectl("scale", "deployment", f"{NAME}-{role}", f"--replicas={spec_decode + 2}")
    reconcile(kube, cluster.get("inferencecluster", NAME), ReconcileSettings())
    assert _count(cluster, "prefill") == spec_decode + 2
    assert _count(cluster, "decode") == spec_decode
    ready = cluster.wait_phase(NAME, "Ready")
    assert ready["prefill"]["desired"] == ready["prefill"]["ready"] == spec_decode + 2
