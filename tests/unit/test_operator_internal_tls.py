"""The operator's internal TLS: when a new certificate is due, that a reconcile rebuilds the same Secret within a
period and the next one after, under one CA, and that Python's ssl (the router's and the nodes') takes them."""

from __future__ import annotations

import base64
import ssl
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509

from kvferry.operator.certificates import (
    CLOCK_SKEW,
    SERVING_LIFETIME,
    cluster_ca,
    serving_certificate,
    serving_period,
)
from kvferry.operator.crd_model import InferenceClusterSpec
from kvferry.operator.internal_tls import (
    NoSigningSeed,
    build_internal_tls_secrets,
    certificate_names,
    server_name,
)
from kvferry.operator.naming import ClusterRef

SEED = b"s" * 32
CREATED = datetime(2026, 1, 1, tzinfo=UTC)
REF = ClusterRef(name="smollm2", namespace="serving", uid="0000-1111")


def spec(internal_tls: dict | None) -> InferenceClusterSpec:
    model = {"source": "/models/smollm2", "servedName": "smollm2"}
    return InferenceClusterSpec.model_validate({"model": model, "internalTls": internal_tls})


def secret_data(now: datetime, seed: bytes = SEED) -> dict[str, bytes]:
    [secret] = build_internal_tls_secrets(REF, spec({"mode": "selfSigned"}), seed, CREATED, now)
    assert secret["type"] == "kubernetes.io/tls" and secret["metadata"]["name"] == "smollm2-internal-tls"
    return {key: base64.b64decode(value) for key, value in secret["data"].items()}


@pytest.mark.parametrize("elapsed_days, index", [(0, 0), (59.9, 0), (60, 1), (119.9, 1), (120, 2), (400, 6)])
def test_a_new_certificate_every_two_thirds_of_a_lifetime(elapsed_days: float, index: int) -> None:
    now = CREATED + timedelta(days=elapsed_days)
    period = serving_period(CREATED, now)
    assert period.index == index
    # The one in use has more than a third of its lifetime left, and began before now.
    assert period.not_before <= now
    assert period.not_after - now > SERVING_LIFETIME / 3
    assert period.not_after - period.not_before == SERVING_LIFETIME + CLOCK_SKEW


def test_a_reconcile_rebuilds_the_same_secret_within_a_period_and_the_next_one_after() -> None:
    first = secret_data(CREATED + timedelta(days=1))
    assert secret_data(CREATED + timedelta(days=59)) == first  # applying it again changes nothing
    rotated = secret_data(CREATED + timedelta(days=61))
    assert rotated["ca.crt"] == first["ca.crt"]  # the routers' trust holds across the rotation
    assert rotated["tls.crt"] != first["tls.crt"] and rotated["tls.key"] != first["tls.key"]
    ca = x509.load_pem_x509_certificate(first["ca.crt"])
    for data in (first, rotated):
        x509.load_pem_x509_certificate(data["tls.crt"]).verify_directly_issued_by(ca)


def test_the_ca_belongs_to_the_seed_and_the_cluster() -> None:
    ca = cluster_ca(SEED, REF.uid, "CA", CREATED)
    assert cluster_ca(b"t" * 32, REF.uid, "CA", CREATED).key_pem != ca.key_pem
    assert cluster_ca(SEED, "another-uid", "CA", CREATED).key_pem != ca.key_pem
    assert cluster_ca(SEED, REF.uid, "CA", CREATED) == ca


def test_the_certificate_names_the_router_checks_and_the_nodes_services() -> None:
    settings = spec({"mode": "selfSigned"}).internal_tls
    assert settings is not None
    assert server_name(REF, settings) == "smollm2-nodes.serving.svc"
    assert certificate_names(REF, settings) == [
        "smollm2-nodes.serving.svc",
        "smollm2-prefill.serving.svc",
        "smollm2-decode.serving.svc",
    ]
    named = spec({"mode": "selfSigned", "serverName": "nodes.example"}).internal_tls
    assert named is not None and server_name(REF, named) == "nodes.example"


def test_no_secret_to_write_unless_self_signed_and_no_seed_is_a_clear_error() -> None:
    assert build_internal_tls_secrets(REF, spec(None), SEED, CREATED, CREATED) == []
    assert (
        build_internal_tls_secrets(
            REF, spec({"mode": "secret", "secretName": "mine"}), None, CREATED, CREATED
        )
        == []
    )
    with pytest.raises(NoSigningSeed, match="KVFERRY_SIGNING_SEED"):
        build_internal_tls_secrets(REF, spec({"mode": "selfSigned"}), None, CREATED, CREATED)


@pytest.mark.parametrize("internal_tls", [{"mode": "secret"}, {"mode": "selfSigned", "secretName": "mine"}])
def test_secret_name_goes_with_mode_secret_only(internal_tls: dict) -> None:
    with pytest.raises(ValueError, match="secretName goes with mode secret"):
        spec(internal_tls)


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, name: str) -> None:
    """A TLS handshake between the two contexts in memory; raises ssl.SSLError as a refused one would."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_side = server.wrap_bio(to_server, to_client, server_side=True)
    client_side = client.wrap_bio(to_client, to_server, server_hostname=name)
    for _ in range(10):
        done = []
        for side in (client_side, server_side):
            try:
                side.do_handshake()
                done.append(True)
            except ssl.SSLWantReadError:
                done.append(False)
        if all(done):
            return
    raise AssertionError("the handshake did not finish")


def test_pythons_ssl_serves_the_certificate_and_a_client_with_the_ca_accepts_it_under_its_name(
    tmp_path,
) -> None:
    ca = cluster_ca(SEED, REF.uid, "CA", CREATED)
    now = datetime.now(UTC)
    period = serving_period(now - timedelta(days=1), now)
    issued = serving_certificate(SEED, REF.uid, ca, ["nodes.test.svc"], period)
    (tmp_path / "tls.crt").write_bytes(issued.cert_pem)
    (tmp_path / "tls.key").write_bytes(issued.key_pem)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    _handshake(server, client, "nodes.test.svc")
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        _handshake(server, client, "someone-else.svc")
    other = ssl.create_default_context(cadata=cluster_ca(b"t" * 32, REF.uid, "CA", CREATED).cert_pem.decode())
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        _handshake(server, other, "nodes.test.svc")
