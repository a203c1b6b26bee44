"""The product's main path on real pods: `helm install`, `kubectl apply -f examples/inferencecluster.yaml`,
and serving through the router's Service while pods are deleted, scaled and the operator rolls.

The tests run in file order on one cluster (a fixture per module: installing it takes minutes): each
leaves the cluster as the next expects it, and the last two take it all down and check that nothing is left.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from cluster.waiting import wait_until
from e2e.kube_cluster import Cluster
from pods.real_node import REPO, PodsNode
from pods.serving_loop import ServingLoop
from support.real_model import RealModel

CHART = REPO / "charts" / "kvferry"
EXAMPLE = REPO / "examples" / "inferencecluster.yaml"
NAMESPACE = "kvferry"
RELEASE = "kvferry"
CLUSTER = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
SERVED_NAME = yaml.safe_load(EXAMPLE.read_text())["spec"]["model"]["servedName"]
NODE_PORT = 8000  # the nodes' and the router's container port (the operator's pod specs)
# Pods load torch and the model on a 2-core machine that runs the tests too: minutes, not seconds.
READY_S = 900
RAW_PROMPT = "The capital of France is"
CHAT_PROMPT = "What is the capital of France?"
MAX_TOKENS = 16


@dataclass
class ServedCluster(Cluster):
    """The e2e tests' namespace view (kubectl, get, items, status) over the real node, plus the router."""

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

    def metric(self, pod: dict[str, Any], name: str) -> float:
        """The sum of a metric's samples on one pod, read from its /metrics over the pod network."""
        text = httpx.get(f"http://{pod['status']['podIP']}:{NODE_PORT}/metrics", timeout=30).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + "{") or line.startswith(name + " "))

    def complete(self, prompt: str, max_tokens: int = MAX_TOKENS) -> str:
        body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        response = httpx.post(f"{self.router}/v1/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]


def local_engine_text(model: Path, prompt: str, max_tokens: int, chat: bool = False) -> str:
    """What `kvferry generate` answers here, on the same model, in one process (the reference)."""
    argv = [sys.executable, "-m", "kvferry", "generate", "--model", str(model), "--prompt", prompt,
            "--max-tokens", str(max_tokens), "--json", *(["--chat"] if chat else [])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.splitlines()[0])["text"]


@pytest.fixture(scope="module")
def served(pods_node: PodsNode) -> ServedCluster:
    pods_node.helm("upgrade", "--install", RELEASE, str(CHART), f"--namespace={NAMESPACE}", "--create-namespace",
                   "--wait", "--timeout=10m")
    cluster = ServedCluster(pods_node, NAMESPACE)
    cluster.kubectl("apply", "-f", str(EXAMPLE))
    cluster.wait_ready()
    return cluster


def test_the_example_reaches_ready_on_real_pods(served: ServedCluster) -> None:
    status = served.wait_ready()
    for role in ("prefill", "decode", "router"):
        assert status[role]["ready"] == 1, status
        [pod] = served.ready_pods(role)
        assert pod["spec"]["nodeName"] == "kvferry-node"
        # A real container ran: the kubelet reports when it started and that it restarted no time.
        [container] = pod["status"]["containerStatuses"]
        assert container["started"] and "running" in container["state"], container
        assert container["restartCount"] == 0, container


def test_the_router_service_serves_models_a_completion_and_a_streaming_chat(
    served: ServedCluster, smollm2: RealModel
) -> None:
    models = httpx.get(f"{served.router}/v1/models", timeout=30)
    assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == [SERVED_NAME], models.text

    # Greedy through prefill pod -> decode pod equals the local engine on the same model, token for token.
    assert served.complete(RAW_PROMPT) == local_engine_text(smollm2.folder, RAW_PROMPT, MAX_TOKENS)

    client = openai.OpenAI(base_url=f"{served.router}/v1", api_key="not-checked", timeout=120)
    stream = client.chat.completions.create(
        model=SERVED_NAME, messages=[{"role": "user", "content": CHAT_PROMPT}], max_tokens=24, temperature=0,
        stream=True,
    )
    pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
    answer = "".join(pieces)
    assert len([piece for piece in pieces if piece]) > 1  # streamed, not one block
    assert "Paris" in answer
    assert answer == local_engine_text(smollm2.folder, CHAT_PROMPT, 24, chat=True)


def test_kv_blocks_cross_from_the_prefill_pod_to_the_decode_pod(served: ServedCluster) -> None:
    [prefill], [decode] = served.ready_pods("prefill"), served.ready_pods("decode")
    sent = served.metric(prefill, "kvferry:kv_transfer_bytes_total")
    received = served.metric(decode, "kvferry:kv_received_bytes_total")
    local = served.metric(decode, "kvferry:local_prefills_total")
    served.complete("Write a long story about a lighthouse keeper who " + "waits and " * 40, max_tokens=4)
    sent = served.metric(prefill, "kvferry:kv_transfer_bytes_total") - sent
    assert sent > 0, "the prefill pod sent no KV"
    assert served.metric(decode, "kvferry:kv_received_bytes_total") - received == sent
    assert served.metric(decode, "kvferry:local_prefills_total") == local  # no fallback to local prefill


def test_a_deleted_decode_pod_comes_back_and_serving_resumes(served: ServedCluster) -> None:
    [old] = served.ready_pods("decode")
    with ServingLoop(served.router, SERVED_NAME, max_requests=1500, max_seconds=800) as loop:
        wait_until("answers before the deletion", lambda: loop.snapshot().answered >= 3, 120)
        served.kubectl("delete", "pod", old["metadata"]["name"], "--wait=false")
        served.wait_ready()
        wait_until("a replacement decode pod", lambda: [p for p in served.ready_pods("decode")
                                                        if p["metadata"]["name"] != old["metadata"]["name"]], 60)
        wait_until(lambda: f"ten answers in a row after the replacement: {loop.snapshot()}",
                   lambda: loop.snapshot().answered_in_a_row >= 10, 300)
    outcomes = loop.stop()
    print(f"decode pod deleted: {outcomes.answered} answered, {len(outcomes.refused)} refused, "
          f"{len(outcomes.failed)} failed; refusals: {outcomes.refused[:3]}")
    assert outcomes.failed == [], outcomes.failed[:5]
    assert outcomes.answered >= 13


def test_decode_scaled_to_two_pods_both_serve(served: ServedCluster) -> None:
    served.kubectl("patch", "inferencecluster", CLUSTER, "--type=merge", "-p", '{"spec": {"decode": {"replicas": 2}}}')
    served.wait_ready(decode=2)
    pods = served.ready_pods("decode")
    assert len(pods) == 2
    before = {pod["metadata"]["name"]: served.metric(pod, "kvferry:kv_received_bytes_total") for pod in pods}

    def both_received() -> bool:
        with ThreadPoolExecutor(4) as pool:  # concurrent, so that the router's load balance spreads them
            list(pool.map(lambda n: served.complete(f"Tell me about the number {n}.", max_tokens=8), range(4)))
        return all(served.metric(pod, "kvferry:kv_received_bytes_total") > before[pod["metadata"]["name"]]
                   for pod in pods)

    wait_until("KV received by both decode pods", both_received, 300, interval=0)


def test_a_helm_upgrade_rolls_the_operator_without_a_failed_request(served: ServedCluster) -> None:
    def operator_pods() -> set[str]:
        return {pod["metadata"]["name"] for pod in served.items("pods", "app.kubernetes.io/component=operator")}

    before = operator_pods()
    assert before
    with ServingLoop(served.router, SERVED_NAME, max_requests=1000, max_seconds=600) as loop:
        wait_until("answers before the upgrade", lambda: loop.snapshot().answered >= 3, 120)
        served.kube.helm("upgrade", RELEASE, str(CHART), f"--namespace={NAMESPACE}", "--reuse-values",
                         "--set", "operator.resyncSeconds=45", "--wait", "--timeout=10m")
        wait_until("the operator's pod replaced", lambda: operator_pods() and not operator_pods() & before, 300)
        served.wait_ready(decode=2)
        answered = loop.snapshot().answered
        wait_until("ten more answers after the roll", lambda: loop.snapshot().answered >= answered + 10, 300)
    outcomes = loop.stop()
    print(f"operator rolled: {outcomes.answered} answered, {len(outcomes.refused)} refused, {len(outcomes.failed)} failed")
    assert (outcomes.failed, outcomes.refused) == ([], []), (outcomes.failed[:5], outcomes.refused[:5])
    # The new operator leads, and its pod owns the Lease (which then goes with it on uninstall).
    lease = json.loads(served.kubectl("get", "lease", RELEASE, "-o", "json").stdout)
    [owner] = lease["metadata"]["ownerReferences"]
    assert lease["spec"]["holderIdentity"] == owner["name"] and owner["name"] in operator_pods()


def test_deleting_the_resource_and_uninstalling_leave_nothing(served: ServedCluster) -> None:
    served.kubectl("delete", "inferencecluster", CLUSTER, "--wait", "--timeout=300s")
    served.kube.helm("uninstall", RELEASE, f"--namespace={NAMESPACE}", "--wait", "--timeout=5m")
    wait_until("no pods", lambda: not served.items("pods"), 300, interval=2)
    kinds = "services,configmaps,deployments,replicasets,serviceaccounts,roles,rolebindings,leases,inferenceclusters"
    left = [f"{item['kind']}/{item['metadata']['name']}" for item in served.items(kinds)
            if (item["kind"], item["metadata"]["name"]) not in {("ConfigMap", "kube-root-ca.crt"),
                                                                ("ServiceAccount", "default")}]
    assert left == []
    cluster_scoped = json.loads(served.kube.kubectl("get", "clusterroles,clusterrolebindings", "-o", "json").stdout)
    assert [item["metadata"]["name"] for item in cluster_scoped["items"] if "kvferry" in item["metadata"]["name"]] == []
    # A finalizer left on anything would hold the namespace in Terminating.
    served.kube.kubectl("delete", "namespace", NAMESPACE, "--wait", "--timeout=120s")


def test_taking_the_node_down_leaves_nothing_behind(pods_node: PodsNode) -> None:
    pods_node.down()
    assert pods_node.leftovers() == []
