"""TLS end to end on real pods: a second cluster beside the tier's, whose router serves HTTPS with a certificate
of the test's CA (spec.router.tlsSecret) and reaches its nodes over HTTPS with the certificate the operator
issued (spec.internalTls selfSigned). The official openai client, given the CA bundle, gets its answers; the
KV crosses from the prefill pod to the decode pod; a node pod answers no plain HTTP.

The cluster is removed at the end: the tier's own cluster is left as test_real_pods_faults.py left it."""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Iterator

import httpx
import openai
import pytest
import yaml
from cluster.pki import Pki
from cluster.waiting import wait_until
from pods.served_cluster import EXAMPLE, NODE_PORT, READY_S, SERVED_NAME, ServedCluster

NAME = "tls"
ROUTER_NAME = f"{NAME}-router.kvferry.svc"  # what the router's certificate names; the client dials its IP
NODES_NAME = f"{NAME}-nodes.kvferry.svc"  # what the operator's certificate names (operator/internal_tls.py)


def _naming(name: str, trusted: ssl.SSLContext) -> httpx.Client:
    """A client that trusts `trusted`'s CAs and checks `name` in the server's certificate while it dials an
    IP, as the router does with its nodes."""

    def check(request: httpx.Request) -> None:
        request.extensions["sni_hostname"] = name

    return httpx.Client(verify=trusted, event_hooks={"request": [check]}, timeout=120)


@pytest.fixture(scope="module")
def tls_cluster(served: ServedCluster, tmp_path_factory) -> Iterator[Pki]:
    pki = Pki(tmp_path_factory.mktemp("pods-tls") / "pki")
    cert, key = pki.serving("tls-router", sans=f"DNS:{ROUTER_NAME}")
    served.kubectl("create", "secret", "tls", f"{NAME}-router-cert", f"--cert={cert}", f"--key={key}")
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"]["name"] = NAME
    manifest["spec"]["router"] |= {"replicas": 1, "tlsSecret": f"{NAME}-router-cert"}
    manifest["spec"]["internalTls"] = {"mode": "selfSigned"}
    try:
        served.apply(manifest)
        served.wait_phase(NAME, "Ready", READY_S)
        yield pki
    finally:
        served.kubectl(
            "delete", "inferencecluster", NAME, "--ignore-not-found", "--wait=true", "--timeout=300s"
        )
        served.kubectl("delete", "secret", f"{NAME}-router-cert", "--ignore-not-found")
        wait_until(
            f"the pods of {NAME} gone",
            lambda: not served.items("pods", f"kvferry.dev/cluster={NAME}"),
            300,
            interval=2,
        )


def _pods(served: ServedCluster, role: str) -> list[dict]:
    return served.items("pods", f"kvferry.dev/cluster={NAME},kvferry.dev/role={role}")


def test_the_openai_client_talks_https_to_the_router_and_the_router_tls_to_its_nodes(
    served: ServedCluster, tls_cluster: Pki
) -> None:
    service = json.loads(served.kubectl("get", "service", f"{NAME}-router", "-o", "json").stdout)
    router = f"https://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
    with _naming(ROUTER_NAME, ssl.create_default_context(cafile=tls_cluster.ca_cert)) as http:
        client = openai.OpenAI(
            base_url=f"{router}/v1", api_key="not-checked", http_client=http, max_retries=0
        )
        answer = client.completions.create(
            model=SERVED_NAME, prompt="The capital of France is", max_tokens=8, temperature=0
        )
        assert answer.usage.completion_tokens > 0 and answer.choices[0].text
        stream = client.chat.completions.create(
            model=SERVED_NAME,
            max_tokens=16,
            temperature=0,
            stream=True,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )
        assert "Paris" in "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        nodes = http.get(f"{router}/stats").json()["nodes"]
    assert sorted(node["role"] for node in nodes) == ["decode", "prefill"], nodes
    assert all(node["url"].startswith("https://") and node["healthy"] for node in nodes), nodes

    # The nodes' certificate is the operator's, for NODES_NAME: checked here as the router checks it.
    secret = served.get("secret", f"{NAME}-internal-tls")
    assert secret is not None
    nodes_ca = ssl.create_default_context(cadata=base64.b64decode(secret["data"]["ca.crt"]).decode())
    [decode] = _pods(served, "decode")
    with _naming(NODES_NAME, nodes_ca) as http:
        metrics = http.get(f"https://{decode['status']['podIP']}:{NODE_PORT}/metrics").text
    name = "kvferry:kv_received_bytes_total"
    received = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith((name + "{", name + " "))
    )
    assert received > 0, metrics  # the prompts' KV came from the prefill pod
    for role in ("prefill", "decode"):
        [pod] = _pods(served, role)
        with pytest.raises(httpx.HTTPError):  # a node's port answers no plain HTTP
            httpx.get(f"http://{pod['status']['podIP']}:{NODE_PORT}/health", timeout=30)
