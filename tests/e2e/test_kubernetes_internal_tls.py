"""spec.internalTls on the real control plane: the operator writes the nodes' certificate and the cluster's CA
into a kubernetes.io/tls Secret, mounts the key pair into the node pods and the CA alone into the router's,
and a reconcile two thirds of a certificate's lifetime later replaces it, under the same CA."""

from __future__ import annotations

import base64
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from e2e.example_cluster import NAME, example
from e2e.kube_cluster import TEST_SIGNING_SEED, Cluster

from kvferry.operator.certificates import SERVING_LIFETIME
from kvferry.operator.connection import load_configuration
from kvferry.operator.kube import Kube
from kvferry.operator.reconcile import ReconcileSettings, reconcile

SECRET = f"{NAME}-internal-tls"
MOUNT = "/etc/kvferry/internal-tls"


def _secret(cluster: Cluster) -> dict[str, bytes]:
    secret = cluster.get("secret", SECRET)
    assert secret is not None and secret["type"] == "kubernetes.io/tls", secret
    return {key: base64.b64decode(value) for key, value in secret["data"].items()}


def _container(cluster: Cluster, role: str) -> dict:
    deployment = cluster.get("deployment", f"{NAME}-{role}")
    assert deployment is not None
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    [volume] = [volume for volume in pod["volumes"] if volume["name"] == "internal-tls"]
    return {
        "container": container,
        "items": [item["key"] for item in volume["secret"]["items"]],
        "secret": volume["secret"]["secretName"],
    }


def test_the_operator_issues_mounts_and_rotates_the_nodes_certificate(
    cluster: Cluster, start_operator
) -> None:
    manifest = example()
    manifest["spec"]["internalTls"] = {"mode": "selfSigned"}
    operator = start_operator()
    cluster.apply(manifest)
    cluster.wait_phase(NAME, "Ready")

    first = _secret(cluster)
    ca = x509.load_pem_x509_certificate(first["ca.crt"])
    cert = x509.load_pem_x509_certificate(first["tls.crt"])
    cert.verify_directly_issued_by(ca)
    key = serialization.load_pem_private_key(first["tls.key"], password=None)
    assert key.public_key() == cert.public_key()
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    server_name = f"{NAME}-nodes.{cluster.namespace}.svc"
    assert names == [
        server_name,
        f"{NAME}-prefill.{cluster.namespace}.svc",
        f"{NAME}-decode.{cluster.namespace}.svc",
    ]

    for role in ("prefill", "decode"):
        node = _container(cluster, role)
        assert (node["secret"], node["items"]) == (SECRET, ["tls.crt", "tls.key"])  # no CA key, no CA needed
        args = node["container"]["args"]
        assert args[args.index("--tls-cert-file") + 1] == f"{MOUNT}/tls.crt"
        assert node["container"]["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    router = _container(cluster, "router")
    assert (router["secret"], router["items"]) == (SECRET, ["ca.crt"])  # the nodes' key stays on the nodes
    args = router["container"]["args"]
    assert args[args.index("--internal-ca-file") + 1] == f"{MOUNT}/ca.crt"
    assert args[args.index("--internal-server-name") + 1] == server_name
    assert router["container"]["readinessProbe"]["httpGet"]["scheme"] == "HTTP"  # its own port: no tlsSecret

    # Resyncs leave the Secret as it is: the same certificate, not a new one each time.
    version = cluster.get("secret", SECRET)["metadata"]["resourceVersion"]
    resyncs = operator.log().count(f"resynced {cluster.namespace}/{NAME}")
    cluster.wait(
        "two resyncs", lambda: operator.log().count(f"resynced {cluster.namespace}/{NAME}") >= resyncs + 2, 60
    )
    assert cluster.get("secret", SECRET)["metadata"]["resourceVersion"] == version

    # Two thirds of its lifetime later a reconcile issues the next one (the operator's would, on its resync).
    operator.stop()  # it would put the current one back at its next resync: its clock says now
    body = cluster.get("inferencecluster", NAME)
    later = datetime.fromisoformat(body["metadata"]["creationTimestamp"]) + SERVING_LIFETIME * 2 / 3
    kube = Kube(load_configuration(cluster.kube.kubeconfig))
    reconcile(kube, body, ReconcileSettings(signing_seed=TEST_SIGNING_SEED, clock=lambda: later))
    rotated = _secret(cluster)
    assert rotated["ca.crt"] == first["ca.crt"]  # routers keep trusting the nodes through the rotation
    assert rotated["tls.crt"] != first["tls.crt"] and rotated["tls.key"] != first["tls.key"]
    renewed = x509.load_pem_x509_certificate(rotated["tls.crt"])
    renewed.verify_directly_issued_by(ca)
    assert renewed.not_valid_before_utc > later - timedelta(minutes=10)
    assert renewed.not_valid_after_utc - later > SERVING_LIFETIME * 0.99
