"""TLS between router and nodes (`--tls-cert-file` on the nodes, `--internal-ca-file` on the router): requests
go through over HTTPS, with the KV crossing from the prefill to the decode node; a node answers no plain HTTP;
a router that trusts another CA, or checks another name, sends nothing to the nodes; a node takes a rotated
certificate without a restart. Random tiny weights: this is about the channel, not the text."""

from __future__ import annotations

import shutil
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from cluster.pki import Pki
from support.disaggregated_cluster import MODEL_NAME, DisaggregatedCluster

# Not a name any resolver knows: the router dials 127.0.0.1 and checks this name in the certificate, as it
# dials pod IPs and checks the operator's name on Kubernetes.
NODE_NAME = "kvferry-nodes.tls-test.svc"
MAX_TOKENS = 4
RELOAD_WAIT_SECONDS = 30  # a node looks at its files every 10 s (kvferry/tls/server.py)


class TLSCluster:
    def __init__(self, folder: Path, pki: Pki, model: Path) -> None:
        self.pki = pki
        self.other = Pki(folder / "other-pki")  # a CA the router does not trust
        cert, key = self.pki.serving("node", sans=f"DNS:{NODE_NAME}")
        # Copies the test may overwrite, as the kubelet rewrites a rotated Secret's files.
        self.cert, self.key = folder / "node.crt", folder / "node.key"
        shutil.copy(cert, self.cert)
        shutil.copy(key, self.key)
        files = ["--tls-cert-file", str(self.cert), "--tls-key-file", str(self.key)]
        self.cluster = DisaggregatedCluster(
            model,
            role_flags={"prefill": files, "decode": files},
            node_scheme="https",
            router_flags=["--internal-ca-file", str(self.pki.ca_cert), "--internal-server-name", NODE_NAME],
        )

    def nodes(self, router: str = "router") -> list[dict]:
        return httpx.get(f"{self.cluster.urls[router]}/stats", timeout=5).json()["nodes"]


@pytest.fixture(scope="module")
def tls(tiny_models, tmp_path_factory) -> Iterator[TLSCluster]:
    folder = tmp_path_factory.mktemp("internal-tls")
    pki = Pki(folder / "pki")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(
            "SSL_CERT_FILE", str(pki.ca_cert)
        )  # this process checks the nodes' readiness and stats too
        cluster = TLSCluster(folder, pki, tiny_models["llama"])
        try:
            yield cluster
        finally:
            cluster.cluster.stop()


def _complete(router: str, prompt: str = "The capital of France is") -> httpx.Response:
    return httpx.post(
        f"{router}/v1/completions",
        timeout=60,
        json={
            "model": MODEL_NAME,
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
        },
    )


def test_the_router_reaches_its_nodes_over_https_and_the_kv_crosses(tls: TLSCluster) -> None:
    cluster = tls.cluster
    nodes = tls.nodes()
    # Static URLs and registry records agree on https: the router joined them (a record's name, not the URL).
    assert sorted(node["name"] for node in nodes) == ["decode-0", "prefill-0"], nodes
    assert all(node["url"].startswith("https://") and node["healthy"] for node in nodes), nodes
    received = cluster.metric("decode-0", "kvferry:kv_received_bytes_total")
    answer = _complete(cluster.router)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == MAX_TOKENS
    assert cluster.metric("decode-0", "kvferry:kv_received_bytes_total") > received  # prefilled on prefill-0


def test_a_node_answers_no_plain_http(tls: TLSCluster) -> None:
    for name in ("prefill-0", "decode-0"):
        plain = tls.cluster.urls[name].replace("https://", "http://")
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{plain}/health", timeout=10)


@pytest.mark.parametrize(
    "flags",
    [
        ["--internal-ca-file", "OTHER_CA", "--internal-server-name", NODE_NAME],
        ["--internal-ca-file", "CA", "--internal-server-name", "someone-else.svc"],
    ],
    ids=["another-ca", "another-name"],
)
def test_a_router_that_does_not_trust_the_nodes_certificate_sends_them_nothing(
    tls: TLSCluster, flags: list[str]
) -> None:
    files = {"OTHER_CA": str(tls.other.ca_cert), "CA": str(tls.pki.ca_cert)}
    name = f"router-{flags[1].lower()}"
    router = tls.cluster.add_router(
        name, ["prefill-0", "decode-0"], [files.get(flag, flag) for flag in flags]
    )
    tls.cluster.wait_until(
        lambda: tls.nodes(name) and not any(node["healthy"] for node in tls.nodes(name)),
        30,
        lambda: f"{name} ejects every node: {tls.nodes(name)}",
    )
    refused = _complete(router)
    assert refused.status_code == 503, refused.text


def test_a_node_serves_a_rotated_certificate_without_a_restart(tls: TLSCluster) -> None:
    port = urlsplit(tls.cluster.urls["decode-0"]).port
    assert port is not None

    def served() -> bytes:
        return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", port)))

    assert served() == ssl.PEM_cert_to_DER_cert(tls.cert.read_text())
    rotated_cert, rotated_key = tls.pki.serving("node-rotated", sans=f"DNS:{NODE_NAME}")
    rotated = ssl.PEM_cert_to_DER_cert(rotated_cert.read_text())
    shutil.copy(rotated_key, tls.key)
    shutil.copy(rotated_cert, tls.cert)
    deadline = time.monotonic() + RELOAD_WAIT_SECONDS
    while served() != rotated:
        assert time.monotonic() < deadline, "decode-0 still serves the certificate it started with"
        time.sleep(0.5)
    assert not tls.cluster.exited("decode-0")
    assert _complete(tls.cluster.router, "Rotated certificates are").status_code == 200
