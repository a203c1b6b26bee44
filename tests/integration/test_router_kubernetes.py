"""Kubernetes discovery against the real kube-apiserver (tests/cluster/): pods labelled as the operator
labels prefill and decode pods become endpoints once Running and Ready (kwok reports them so), and
drop out when deleted; pods of another cluster are never seen."""

from __future__ import annotations

import json
import time

from kvferry.router.config import DiscoverySection
from kvferry.router.kubernetes_discovery import KubernetesDiscovery

PORT = 8000


def pod(name: str, cluster: str, role: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"kvferry.dev/cluster": cluster, "kvferry.dev/role": role}},
        "spec": {"containers": [{"name": "node", "image": "kvferry:test"}]},
    }


def wait_for(discovery: KubernetesDiscovery, expected: dict[str, int], timeout: float = 60) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        endpoints = discovery.endpoints()
        counts = {role: sum(e.role == role for e in endpoints) for role in expected}
        if counts == expected:
            return endpoints
        time.sleep(0.3)
    raise AssertionError(f"expected {expected} endpoints, have {discovery.endpoints()}")


def test_pods_of_the_cluster_are_discovered_watched_and_dropped(kube, kube_namespace):
    settings = DiscoverySection(
        mode="kubernetes", namespace=kube_namespace, port=PORT, kubeconfig=kube.kubeconfig,
        selectors={role: {"kvferry.dev/cluster": "c1", "kvferry.dev/role": role} for role in ("prefill", "decode")},
    )
    discovery = KubernetesDiscovery.from_config(settings)
    discovery.start()
    try:
        pods = [pod("c1-prefill-a", "c1", "prefill"), pod("c1-decode-a", "c1", "decode"), pod("c2-prefill-a", "c2", "prefill")]
        kube.kubectl(f"--namespace={kube_namespace}", "apply", "-f", "-",
                     input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
        wait_for(discovery, {"prefill": 1, "decode": 1})
        # Added later: the watch sees it without a new list.
        kube.kubectl(f"--namespace={kube_namespace}", "apply", "-f", "-", input=json.dumps(pod("c1-prefill-b", "c1", "prefill")))
        endpoints = wait_for(discovery, {"prefill": 2, "decode": 1})
        ips = json.loads(kube.kubectl(f"--namespace={kube_namespace}", "get", "pods", "-l", "kvferry.dev/cluster=c1",
                                      "-o", "json").stdout)["items"]
        assert sorted(e.url for e in endpoints) == sorted(f"http://{p['status']['podIP']}:{PORT}" for p in ips)
        kube.kubectl(f"--namespace={kube_namespace}", "delete", "pod", "c1-prefill-a", "--wait=false")
        remaining = wait_for(discovery, {"prefill": 1, "decode": 1})
        gone = next(p for p in ips if p["metadata"]["name"] == "c1-prefill-a")["status"]["podIP"]
        assert all(gone not in e.url for e in remaining if e.role == "prefill")
    finally:
        discovery.stop()
