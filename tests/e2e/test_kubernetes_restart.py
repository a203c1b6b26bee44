"""Operator faults on the real control plane: a SIGKILL in the middle of a reconcile, a cluster deleted
while no operator runs, and two operators sharing one Lease (docs/reliability.md lists the promises)."""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from typing import Any

import pytest
from e2e.example_cluster import CHILD_KINDS, EXAMPLE, EXPECTED_CHILDREN, NAME, SELECTOR, example
from e2e.kube_cluster import TEST_LEASE_DURATION_S, TEST_RESYNC_S, Cluster, OperatorProcess

from kvferry.cli.ports import free_port

LEASE = "kvferry-operator"
# A candidate takes over once it has seen the Lease unchanged for a full duration; it polls every fifth
# of one. The rest is room for a loaded machine.
HANDOVER_BOUND_S = 2 * TEST_LEASE_DURATION_S + 15
# With the test hook, each child apply takes a second: a kill after the fifth lands mid-reconcile.
SLOW_APPLY = "--test-hook-apply-delay=1.0"
HALF_WAY = 5
EVERYTHING_OWNED = f"{CHILD_KINDS},replicasets,pods"


def child_names(cluster: Cluster, selector: str = SELECTOR) -> list[tuple[str, str]]:
    return sorted((item["kind"], item["metadata"]["name"]) for item in cluster.items(CHILD_KINDS, selector))


def lease_holder(cluster: Cluster) -> str:
    lease = cluster.get("lease", LEASE) or {}
    return (lease.get("spec") or {}).get("holderIdentity") or ""


def kill_half_way(cluster: Cluster, operator: OperatorProcess) -> None:
    """SIGKILL `operator` (started with SLOW_APPLY) between two child applies; the children it left."""
    cluster.wait(
        "the reconcile to be half-way", lambda: len(child_names(cluster)) >= HALF_WAY, 60, interval=0.1
    )
    operator.kill()
    partial = child_names(cluster)
    assert HALF_WAY <= len(partial) < sum(EXPECTED_CHILDREN.values()), f"the kill missed: {partial}"
    assert ("Deployment", f"{NAME}-router") not in partial  # the last child to be applied


def assert_one_ready_copy_of_each_child(cluster: Cluster, status: dict[str, Any]) -> None:
    counts = Counter(kind for kind, _ in child_names(cluster))
    assert counts == EXPECTED_CHILDREN
    owner = cluster.get("inferencecluster", NAME)
    for child in cluster.items(CHILD_KINDS, SELECTOR):
        assert [ref["uid"] for ref in child["metadata"]["ownerReferences"]] == [owner["metadata"]["uid"]]
    assert status["observedGeneration"] == owner["metadata"]["generation"]
    for role, count in (("prefill", 1), ("decode", 1), ("router", 2)):
        assert status[role] == {"desired": count, "ready": count, "updated": count}
        assert len(cluster.items("replicasets", f"{SELECTOR},kvferry.dev/role={role}")) == 1


@pytest.mark.parametrize("successor", ["restarted", "standby"])
def test_kill_in_the_middle_of_a_reconcile(cluster: Cluster, start_operator, successor: str) -> None:
    """restarted: the Deployment brings the one replica back; standby: a second replica takes the Lease."""
    slow = start_operator(SLOW_APPLY, identity="killed")
    cluster.wait("the first operator to lead", lambda: lease_holder(cluster) == "killed", 30)
    standby = start_operator(identity="successor") if successor == "standby" else None
    cluster.apply(EXAMPLE.read_text())
    kill_half_way(cluster, slow)
    successor_process = standby or start_operator(identity="successor")

    # A restarted process must first start (seconds of imports on a loaded machine); a standby is waiting.
    bound = HANDOVER_BOUND_S if standby else HANDOVER_BOUND_S + 45
    cluster.wait("the successor to take the Lease", lambda: lease_holder(cluster) == "successor", bound)
    status = cluster.wait_phase(NAME, "Ready")
    assert_one_ready_copy_of_each_child(cluster, status)
    assert cluster.get("lease", LEASE)["spec"]["leaseTransitions"] == 1
    assert successor_process.troubles() == []


def test_cluster_deleted_while_the_operator_is_down(cluster: Cluster, start_operator) -> None:
    # Killed mid-reconcile, so the deletion also meets a half-built set of children.
    slow = start_operator(SLOW_APPLY)
    cluster.apply(EXAMPLE.read_text())
    kill_half_way(cluster, slow)
    # No finalizer: deleting does not wait for an operator, and the garbage collector takes the children.
    cluster.kubectl("delete", "inferencecluster", NAME, "--wait=true", "--timeout=60s")
    cluster.wait("every child garbage-collected", lambda: not cluster.items(EVERYTHING_OWNED, SELECTOR), 90)

    restarted = start_operator()
    # Evidence that the restarted operator is at work: it builds a second cluster and resyncs it.
    cluster.apply(example("second"))
    cluster.wait_phase("second", "Ready")
    cluster.wait(
        "a resync", lambda: f"resynced {cluster.namespace}/second" in restarted.log(), TEST_RESYNC_S + 30
    )
    assert cluster.get("inferencecluster", NAME) is None
    assert cluster.items(EVERYTHING_OWNED, SELECTOR) == []
    assert (
        Counter(kind for kind, _ in child_names(cluster, "kvferry.dev/cluster=second")) == EXPECTED_CHILDREN
    )
    assert restarted.troubles() == []


def health(port: int) -> dict[str, bool] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return json.load(response)
    except OSError:
        return None


def test_two_operators_do_not_fight(cluster: Cluster, start_operator) -> None:
    ports = free_port(), free_port()
    first = start_operator("--health-host=127.0.0.1", f"--health-port={ports[0]}", identity="first")
    cluster.wait("first to take the lease", lambda: lease_holder(cluster) == "first", 30)
    second = start_operator("--health-host=127.0.0.1", f"--health-port={ports[1]}", identity="second")
    # Both answer their liveness probe; only one says it leads.
    assert cluster.wait("first's /healthz", lambda: health(ports[0])) == {"ok": True, "leader": True}
    assert cluster.wait("second's /healthz", lambda: health(ports[1])) == {"ok": True, "leader": False}

    cluster.apply(EXAMPLE.read_text())
    cluster.wait_phase(NAME, "Ready")
    assert "reconcile-on-create" in first.log()
    assert "reconcile" not in second.log() and "acquired lease" not in second.log()
    assert Counter(kind for kind, _ in child_names(cluster)) == EXPECTED_CHILDREN
    prefill = json.loads(
        cluster.kubectl("get", "deployment", f"{NAME}-prefill", "-o", "json", "--show-managed-fields").stdout
    )
    managers = {
        entry["manager"] for entry in prefill["metadata"]["managedFields"] if entry["operation"] == "Apply"
    }
    assert managers == {"kvferry-operator"}

    # A crashed leader keeps the lease until it expires; then the standby takes over and reconciles.
    first.kill()
    cluster.wait("second to take over", lambda: lease_holder(cluster) == "second", HANDOVER_BOUND_S)
    assert cluster.wait(
        "second's /healthz as leader", lambda: health(ports[1]) == {"ok": True, "leader": True}
    )
    cluster.patch_spec(NAME, {"decode": {"replicas": 2}})
    status = cluster.wait_phase(NAME, "Ready")
    assert status["decode"] == {"desired": 2, "ready": 2, "updated": 2}
    assert Counter(kind for kind, _ in child_names(cluster)) == EXPECTED_CHILDREN
    assert cluster.get("lease", LEASE)["spec"]["leaseTransitions"] == 1

    # Deleting under the new leader: the garbage collector takes every child and nothing brings one back.
    cluster.kubectl("delete", "inferencecluster", NAME, "--wait=true", "--timeout=60s")
    cluster.wait("every child garbage-collected", lambda: not cluster.items(EVERYTHING_OWNED, SELECTOR), 90)
    assert second.troubles() == []

    # A clean stop hands the lease over at once instead of making the next leader wait it out.
    second.stop()
    assert lease_holder(cluster) == ""
    # SIGTERM went to the operator's stop flag, not to kopf's signal path, which idles 5 s (runner.py).
    assert "Stop-flag is set" in second.log() and "Signal SIGTERM is received" not in second.log()
