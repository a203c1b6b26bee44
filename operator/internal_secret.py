"""The cluster's own secrets, made once per InferenceCluster: the token the router sends to the nodes (and
the nodes' transfer engines to each other), and the managed Redis's password.

Random, so not built with the other children: a server-side apply every reconcile would need the values
again, and new ones would lock every running pod out. The Secret is created when missing and never
written after; it is owned by the InferenceCluster, so it goes when the cluster does. A user's
`clusterTokenSecret` takes the token's place; the password is used only by a managed Redis.

The operator never reads it: each reconcile asks to create it, and "already exists" is the answer that it
does. So the operator's role may create Secrets but read none, in any namespace it manages.
"""

from __future__ import annotations

import secrets

from kubernetes.client.exceptions import ApiException

from kvferry.operator.kube import Kube
from kvferry.operator.naming import ClusterRef, child_metadata

TOKEN_KEY = "cluster-token"
REDIS_PASSWORD_KEY = "redis-password"
TOKEN_BYTES = 32


def internal_secret_name(ref: ClusterRef) -> str:
    return ref.child_name("internal")


def ensure_internal_secret(kube: Kube, ref: ClusterRef) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": child_metadata(ref, "internal"),
        "type": "Opaque",
        "stringData": {TOKEN_KEY: secrets.token_urlsafe(TOKEN_BYTES),
                       REDIS_PASSWORD_KEY: secrets.token_urlsafe(TOKEN_BYTES)},
    }
    try:
        kube.create(secret)
    except ApiException as error:
        if error.status != 409:  # made by an earlier reconcile, or another operator: it stands
            raise
