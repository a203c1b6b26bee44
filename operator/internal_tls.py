"""TLS between router and nodes (spec.internalTls): the Secret the pods mount, the name the router checks, and,
in mode selfSigned, that Secret itself: `<name>-internal-tls` (kubernetes.io/tls: tls.crt and tls.key, the
nodes' certificate; ca.crt, the cluster's CA), rebuilt by every reconcile from the operator's signing seed
(certificates.py), the resync loop's included: that is the rotation's timer.

Nodes mount tls.crt and tls.key, routers only ca.crt; both load a changed file without a restart
(kvferry/tls/), so a rotation restarts no pod and a node keeps its model and KV cache. Mode secret mounts the
user's Secret the same way, and a renewal of it (cert-manager's) reaches the pods the same way.

Pod IPs are not known when a certificate is issued, and the router dials pod IPs: the certificate names the
nodes by one name (`server_name`), which the router checks on every call instead of the address.

Nothing is read back: the operator's role may write Secrets but read none.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Any

from kvferry.operator.certificates import cluster_ca, serving_certificate, serving_period
from kvferry.operator.crd_model import InferenceClusterSpec, InternalTLSSpec
from kvferry.operator.naming import NODE_ROLES, ClusterRef, child_metadata

CA_CERT_KEY, CERT_KEY, KEY_KEY = "ca.crt", "tls.crt", "tls.key"
SEED_ENV = "KVFERRY_SIGNING_SEED"  # the operator's seed (the chart's Secret <release>-kvferry-operator)


class NoSigningSeed(ValueError):
    """A cluster asks for mode selfSigned, and the operator was started without a seed."""


def server_name(ref: ClusterRef, settings: InternalTLSSpec) -> str:
    """The name every node's certificate carries and the router checks."""
    return settings.server_name or f"{ref.child_name('nodes')}.{ref.namespace}.svc"


def certificate_names(ref: ClusterRef, settings: InternalTLSSpec) -> list[str]:
    """The issued certificate's names: `server_name`, and the nodes' headless Services, for a client that
    reaches a node by its Service's DNS name."""
    return [server_name(ref, settings)] + [
        f"{ref.child_name(role)}.{ref.namespace}.svc" for role in NODE_ROLES
    ]


def serving_secret_name(ref: ClusterRef, settings: InternalTLSSpec) -> str:
    """The Secret the pods mount: the user's in mode secret, else the one the operator writes."""
    return settings.secret_name if settings.secret_name is not None else ref.child_name("internal-tls")


def build_internal_tls_secrets(
    ref: ClusterRef, spec: InferenceClusterSpec, seed: bytes | None, created: datetime, now: datetime
) -> list[dict[str, Any]]:
    """The Secret of mode selfSigned as of `now` (none in the other modes). `created`: the cluster's creation,
    where its certificates' periods begin. Raises NoSigningSeed."""
    settings = spec.internal_tls
    if settings is None or settings.mode != "selfSigned":
        return []
    if seed is None:
        raise NoSigningSeed(
            f"internalTls.mode selfSigned needs the operator's signing seed (${SEED_ENV}), which "
            "this operator was started without; the chart always gives one"
        )
    ca = cluster_ca(seed, ref.uid, f"kvferry internal CA {ref.namespace}/{ref.name}", created)
    issued = serving_certificate(
        seed, ref.uid, ca, certificate_names(ref, settings), serving_period(created, now)
    )
    data = {CERT_KEY: issued.cert_pem, KEY_KEY: issued.key_pem, CA_CERT_KEY: ca.cert_pem}
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": child_metadata(ref, "internal-tls"),
            "type": "kubernetes.io/tls",
            "data": {key: base64.b64encode(value).decode() for key, value in data.items()},
        }
    ]
