"""Kubernetes discovery against the real kube-apiserver (tests/cluster/): pods labelled as the operator
labels prefill and decode pods become endpoints once Running and Ready (kwok reports them so), and
drop out when deleted; pods of another cluster are never seen. Watches ask for bookmarks and resume
from the last resourceVersion, and lists in a row back off."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from itertools import pairwise

import httpx
from kubernetes import client, config
from kubernetes.client import V1PodList
from support.redis_server import free_port

from kvferry.router.config import DiscoverySection
from kvferry.router.discovery.kubernetes import KubernetesDiscovery

PORT = 8000
SELECTORS = {role: {"kvferry.dev/cluster": "c1", "kvferry.dev/role": role} for role in ("prefill", "decode")}


class RecordingCoreV1Api(client.CoreV1Api):
    """The real API, recording each call discovery makes of it: (time, list or watch, resourceVersion)."""

    def __init__(self, api_client: client.ApiClient) -> None:
        super().__init__(api_client)
        self.calls: list[tuple[float, str, str | None]] = []

    # The watch helper deserializes events into the type this annotation names.
    def list_namespaced_pod(self, namespace: str, **kwargs) -> V1PodList:
        kind = "watch" if kwargs.get("watch") else "list"
        self.calls.append((time.monotonic(), kind, kwargs.get("resource_version")))
        return super().list_namespaced_pod(namespace, **kwargs)

    def count(self, kind: str) -> int:
        return sum(k == kind for _, k, _ in self.calls)


def recording_discovery(kube, namespace: str) -> tuple[KubernetesDiscovery, RecordingCoreV1Api]:
    api = RecordingCoreV1Api(config.new_client_from_config(config_file=kube.kubeconfig))
    return KubernetesDiscovery(api, namespace, SELECTORS, PORT, watch_seconds=5), api


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
    discovery = KubernetesDiscovery.from_config(settings, "http")
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
        # The whole URL: an address is a substring of another's (10.0.0.1 of 10.0.0.12) once kwok reuses them.
        assert f"http://{gone}:{PORT}" not in {e.url for e in remaining if e.role == "prefill"}
    finally:
        discovery.stop()


def test_the_router_command_discovers_pods_by_the_selectors_it_is_given(kube, kube_namespace, tiny_models, tmp_path):
    pods = [pod("c1-prefill-a", "c1", "prefill"), pod("c1-decode-a", "c1", "decode"), pod("c1-decode-b", "c1", "decode")]
    kube.kubectl(f"--namespace={kube_namespace}", "apply", "-f", "-",
                 input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
    port = free_port()
    args = [sys.executable, "-m", "kvferry", "router", "--model", str(tiny_models["llama"]), "--port", str(port),
            "--discovery", "kubernetes", "--kubeconfig", kube.kubeconfig, "--namespace", kube_namespace,
            "--node-port", "8123", "--prefill-selector", "kvferry.dev/cluster=c1,kvferry.dev/role=prefill",
            "--decode-selector", "kvferry.dev/role=decode,kvferry.dev/cluster=c1"]
    with (tmp_path / "router.log").open("w") as log:
        router = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline, nodes = time.monotonic() + 90, []
        while time.monotonic() < deadline and len(nodes) < 3:
            assert router.poll() is None, (tmp_path / "router.log").read_text()
            try:
                nodes = httpx.get(f"http://127.0.0.1:{port}/stats", timeout=1).json()["nodes"]
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert sorted(n["role"] for n in nodes) == ["decode", "decode", "prefill"], nodes
        assert all(n["url"].startswith("http://10.244.") and n["url"].endswith(":8123") for n in nodes), nodes
        # Nothing listens on kwok's pod IPs: the probes eject them, and the router is not ready.
        deadline = time.monotonic() + 20
        while httpx.get(f"http://127.0.0.1:{port}/ready").status_code != 503 and time.monotonic() < deadline:
            time.sleep(0.3)
        stats = httpx.get(f"http://127.0.0.1:{port}/stats").json()
        assert [n["healthy"] for n in stats["nodes"]] == [False] * 3, stats
    finally:
        router.terminate()
        router.wait(timeout=15)


def apply_pods(kube, namespace: str, *pods: dict) -> None:
    kube.kubectl(f"--namespace={namespace}", "apply", "-f", "-",
                 input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(pods)}))


def wait_until(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_watches_take_bookmarks_and_resume_without_listing_again(kube, kube_namespace, caplog):
    caplog.set_level(logging.DEBUG, logger="kvferry.router.discovery.kubernetes")
    discovery, api = recording_discovery(kube, kube_namespace)
    discovery.start()
    try:
        apply_pods(kube, kube_namespace, pod("c1-prefill-a", "c1", "prefill"), pod("c1-decode-a", "c1", "decode"))
        wait_for(discovery, {"prefill": 1, "decode": 1})
        # Watches of 5 s end and re-open, and the apiserver sends a bookmark (a dict, not a pod) 2 s before each ends.
        wait_until(lambda: "bookmark at" in caplog.text and api.count("watch") >= 6, "bookmarks over several watches")
        apply_pods(kube, kube_namespace, pod("c1-decode-b", "c1", "decode"))
        wait_for(discovery, {"prefill": 1, "decode": 2})
    finally:
        discovery.stop()
    assert api.count("list") == 2, api.calls  # one per role: every later watch resumed from a version
    assert all(version is not None for _, kind, version in api.calls if kind == "watch"), api.calls
    assert "listing again" not in caplog.text


def test_lists_in_a_row_back_off(tmp_path):
    # Nothing listens at this address: every list fails at once, and each retry waits twice as long.
    api = RecordingCoreV1Api(client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{free_port()}")))
    discovery = KubernetesDiscovery(api, "default", {"decode": SELECTORS["decode"]}, PORT)
    discovery.start()
    try:
        wait_until(lambda: api.count("list") >= 4, "four lists", timeout=20)
    finally:
        discovery.stop()
    times = [t for t, _, _ in api.calls]
    gaps = [later - earlier for earlier, later in pairwise(times)]
    assert gaps[0] >= 0.4 and all(later > 1.6 * earlier for earlier, later in pairwise(gaps[:4])), gaps
