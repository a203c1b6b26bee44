"""The product's main path on real pods: `helm install`, `kubectl apply -f examples/inferencecluster.yaml`,
and serving through the router's Service while prefill and decode are scaled under load and the operator rolls.

The tests run in file order on the tier's one cluster (served_cluster.py): each leaves it as the next
expects it; the last leaves two decode pods for test_real_pods_faults.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
from cluster.waiting import wait_until
from pods.served_cluster import CHART, CLUSTER, NAMESPACE, RELEASE, SERVED_NAME, ServedCluster, pod_url
from pods.serving_loop import ServingLoop, undisturbed_texts
from support.real_model import RealModel

RAW_PROMPT = "The capital of France is"
CHAT_PROMPT = "What is the capital of France?"
MAX_TOKENS = 16


def local_engine_text(model: Path, prompt: str, max_tokens: int, chat: bool = False) -> str:
    """What `kvferry generate` answers here, on the same model, in one process (the reference)."""
    argv = [sys.executable, "-m", "kvferry", "generate", "--model", str(model), "--prompt", prompt,
            "--max-tokens", str(max_tokens), "--json", *(["--chat"] if chat else [])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout.splitlines()[0])["text"]


def test_the_example_reaches_ready_on_real_pods(served: ServedCluster) -> None:
    status = served.wait_ready()
    for role, count in (("prefill", 1), ("decode", 1), ("router", 2)):
        assert status[role]["ready"] == count, status
        pods = served.ready_pods(role)
        assert len(pods) == count
        for pod in pods:
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
    assert served.complete(RAW_PROMPT, MAX_TOKENS) == local_engine_text(smollm2.folder, RAW_PROMPT, MAX_TOKENS)

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


def test_nodes_refuse_calls_without_the_operators_token_and_the_operator_keeps_to_its_namespace(
    served: ServedCluster,
) -> None:
    """Installed with defaults: the token is the one the operator made (Secret <cluster>-internal), which the KV
    transfers of the test above carried too; the operator's rights end at its release namespace."""
    for role in ("prefill", "decode"):
        url = pod_url(served.ready_pods(role)[0])
        for headers in ({}, {"Authorization": "Bearer not-the-clusters-token"}):
            refused = httpx.post(f"{url}/internal/v1/abort/none", headers=headers, timeout=30)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_cluster_token", role
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200  # probes stay open
    operator = served.items("pods", "app.kubernetes.io/component=operator")[0]
    account = f"--as=system:serviceaccount:{NAMESPACE}:{operator['spec']['serviceAccountName']}"

    def can(*asked: str) -> bool:
        return served.kube.kubectl("auth", "can-i", *asked, account, check=False).stdout.strip() == "yes"

    assert can("create", "deployments", f"--namespace={NAMESPACE}")
    for elsewhere in ("--namespace=default", "--namespace=kube-system", "--all-namespaces"):
        for verb, resource in (("create", "deployments"), ("patch", "inferenceclusters"), ("create", "secrets")):
            assert not can(verb, resource, elsewhere), (verb, resource, elsewhere)


def test_prefill_scaled_out_and_in_under_load_fails_no_request(served: ServedCluster) -> None:
    """1 -> 2 -> 1 while clients stream: the new pod joins when Ready, the removed one leaves the router's
    choice at once and finishes its prefills and transfers within its drain; nothing fails or is refused."""
    expected = undisturbed_texts(served.router, SERVED_NAME)
    for count in (2, 1):
        outcomes = served.under_load(expected, f"prefill scaled to {count}",
                                     lambda count=count: served.patch_spec(CLUSTER, {"prefill": {"replicas": count}}),
                                     lambda count=count: served.wait_scaled("prefill", count))
        assert (outcomes.failed, outcomes.refused) == ([], []), served.described(outcomes)


def test_decode_scaled_out_under_load_fails_no_stream_and_both_pods_serve(served: ServedCluster) -> None:
    """1 -> 2 (test_real_pods_faults.py scales it back in, under load too)."""
    expected = undisturbed_texts(served.router, SERVED_NAME)
    outcomes = served.under_load(expected, "decode scaled 1 -> 2",
                                 lambda: served.patch_spec(CLUSTER, {"decode": {"replicas": 2}}),
                                 lambda: served.wait_scaled("decode", 2))
    assert (outcomes.failed, outcomes.refused) == ([], []), served.described(outcomes)
    pods = served.ready_pods("decode")
    before = {pod["metadata"]["name"]: served.metric(pod, "kvferry:kv_received_bytes_total") for pod in pods}

    def both_received() -> bool:
        with ThreadPoolExecutor(4) as pool:  # concurrent, so that the router's load balance spreads them
            list(pool.map(lambda n: served.complete(f"Tell me about the number {n}.", max_tokens=8), range(4)))
        return all(served.metric(pod, "kvferry:kv_received_bytes_total") > before[pod["metadata"]["name"]]
                   for pod in pods)

    wait_until("KV received by both decode pods", both_received, 300, interval=0)


def test_a_router_pod_deleted_under_load_fails_no_request(served: ServedCluster) -> None:
    """The example's two routers behind the Service: one deleted while clients stream (its in-flight streams
    finish within its drain, new connections go to the other) and replaced. The routers share nothing that an
    answer depends on (nodes from discovery, the prefix index in Redis)."""
    expected = undisturbed_texts(served.router, SERVED_NAME)
    victim = served.ready_pods("router")[0]["metadata"]["name"]
    outcomes = served.under_load(expected, "a router pod deleted",
                                 lambda: served.kubectl("delete", "pod", victim, "--wait=false"),
                                 lambda: served.wait_scaled("router", 2))
    assert (outcomes.failed, outcomes.refused) == ([], []), served.described(outcomes)
    assert victim not in {pod["metadata"]["name"] for pod in served.ready_pods("router")}


def test_a_helm_upgrade_rolls_the_operator_without_a_failed_request(served: ServedCluster) -> None:
    def operator_pods() -> set[str]:
        return {pod["metadata"]["name"] for pod in served.items("pods", "app.kubernetes.io/component=operator")}

    before = operator_pods()
    assert before
    expected = undisturbed_texts(served.router, SERVED_NAME)
    with ServingLoop(served.router, SERVED_NAME, expected, max_requests=1000, max_seconds=600) as loop:
        wait_until("answers before the upgrade", lambda: loop.snapshot().answered >= 3, 120)
        served.kube.helm("upgrade", RELEASE, str(CHART), f"--namespace={NAMESPACE}", "--reuse-values",
                         "--set", "operator.resyncSeconds=45", "--wait", "--timeout=10m")
        wait_until("the operator's pod replaced", lambda: operator_pods() and not operator_pods() & before, 300)
        served.wait_ready(decode=2)
        answered = loop.snapshot().answered
        wait_until("ten more answers after the roll", lambda: loop.snapshot().answered >= answered + 10, 300)
    outcomes = loop.stop()
    print(f"operator rolled: {outcomes}")
    assert (outcomes.failed, outcomes.refused) == ([], []), (outcomes.failed[:5], outcomes.refused[:5])
    # The new operator leads, and its pod owns the Lease (which then goes with it on uninstall).
    lease = json.loads(served.kubectl("get", "lease", RELEASE, "-o", "json").stdout)
    [owner] = lease["metadata"]["ownerReferences"]
    assert lease["spec"]["holderIdentity"] == owner["name"] and owner["name"] in operator_pods()
