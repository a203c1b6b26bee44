"""Crashes and replicas: a SIGKILL in the middle of a reconcile, and two operators sharing one Lease."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections import Counter

from tests.e2e.conftest import TEST_LEASE_DURATION_S, Cluster
from tests.e2e.example_cluster import CHILD_KINDS, EXAMPLE, EXPECTED_CHILDREN, NAME, SELECTOR

LEASE = "kvferry-operator"


def child_names(cluster: Cluster) -> list[tuple[str, str]]:
    return sorted((item["kind"], item["metadata"]["name"]) for item in cluster.items(CHILD_KINDS, SELECTOR))


def lease_holder(cluster: Cluster) -> str:
    lease = cluster.get("lease", LEASE) or {}
    return (lease.get("spec") or {}).get("holderIdentity") or ""


def test_restart_in_the_middle_of_a_reconcile(cluster: Cluster, start_operator) -> None:
    # The test hook makes each child apply take a second, so the kill lands between two of them.
    slow = start_operator("--test-hook-apply-delay=1.0")
    cluster.apply(EXAMPLE.read_text())
    cluster.wait("the reconcile to be half-way", lambda: len(child_names(cluster)) >= 5, 60, interval=0.1)
    slow.kill()
    partial = child_names(cluster)
    assert 5 <= len(partial) < sum(EXPECTED_CHILDREN.values()), f"the kill missed the reconcile: {partial}"
    assert ("Deployment", f"{NAME}-router") not in partial

    start_operator()
    status = cluster.wait_phase(NAME, "Ready")
    counts = Counter(kind for kind, _ in child_names(cluster))
    assert counts == EXPECTED_CHILDREN
    assert len(set(child_names(cluster))) == sum(EXPECTED_CHILDREN.values())  # no second copy of anything
    body = cluster.get("inferencecluster", NAME)
    assert status["observedGeneration"] == body["metadata"]["generation"]
    for role in ("prefill", "decode", "router"):
        assert status[role] == {"desired": 1, "ready": 1, "updated": 1}
        assert len(cluster.items("replicasets", f"{SELECTOR},kvferry.dev/role={role}")) == 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    cluster.wait("second to start waiting", lambda: "waiting for lease" in second.log(), 30)
    # Both answer their liveness probe; only one says it leads.
    assert cluster.wait("first's /healthz", lambda: health(ports[0])) == {"ok": True, "leader": True}
    assert cluster.wait("second's /healthz", lambda: health(ports[1])) == {"ok": True, "leader": False}

    cluster.apply(EXAMPLE.read_text())
    cluster.wait_phase(NAME, "Ready")
    assert "reconcile-on-create" in first.log()
    assert "reconcile" not in second.log() and "acquired lease" not in second.log()
    prefill = json.loads(
        cluster.kubectl("get", "deployment", f"{NAME}-prefill", "-o", "json", "--show-managed-fields").stdout
    )
    managers = {
        entry["manager"] for entry in prefill["metadata"]["managedFields"] if entry["operation"] == "Apply"
    }
    assert managers == {"kvferry-operator"}

    # A crashed leader keeps the lease until it expires; then the standby takes over and reconciles.
    first.kill()
    cluster.wait(
        "second to take over", lambda: lease_holder(cluster) == "second", 4 * TEST_LEASE_DURATION_S + 10
    )
    cluster.patch_spec(NAME, {"decode": {"replicas": 2}})
    status = cluster.wait_phase(NAME, "Ready")
    assert status["decode"] == {"desired": 2, "ready": 2, "updated": 2}
    assert cluster.get("lease", LEASE)["spec"]["leaseTransitions"] == 1

    # A clean stop hands the lease over at once instead of making the next leader wait it out.
    second.stop()
    assert lease_holder(cluster) == ""
