"""Identity of the InferenceCluster resource and the names, labels and owner references of its children.

Every child's name is derived from the cluster's name, so applying the same spec twice (or after a restart
in the middle of a reconcile) addresses the same objects instead of creating new ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

GROUP = "kvferry.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceCluster"
PLURAL = "inferenceclusters"
SINGULAR = "inferencecluster"
SHORT_NAMES = ("ic",)
CRD_NAME = f"{PLURAL}.{GROUP}"

CLUSTER_LABEL = f"{GROUP}/cluster"
ROLE_LABEL = f"{GROUP}/role"
CONFIG_HASH_ANNOTATION = f"{GROUP}/config-hash"
MANAGED_BY = "kvferry-operator"
FIELD_MANAGER = MANAGED_BY

# The longest child suffix is "-prefill"; Service names are DNS-1035 labels of at most 63 characters,
# and the cluster name is also a label value (at most 63). 50 leaves room for both.
MAX_CLUSTER_NAME_LENGTH = 50

Component = Literal["prefill", "decode", "router", "redis", "config", "internal", "internal-ca", "internal-tls", "nodes"]
NodeRole = Literal["prefill", "decode"]
NODE_ROLES: tuple[NodeRole, ...] = ("prefill", "decode")
ServingRole = Literal["prefill", "decode", "router"]
SERVING_ROLES: tuple[ServingRole, ...] = ("prefill", "decode", "router")


@dataclass(frozen=True)
class ClusterRef:
    """The parts of an InferenceCluster's metadata that its children depend on."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ClusterRef:
        meta = body["metadata"]
        return cls(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])

    def child_name(self, component: Component) -> str:
        return f"{self.name}-{component}"


def selector_labels(ref: ClusterRef, component: Component) -> dict[str, str]:
    """The labels a Deployment selects its pods by and a Service routes by; immutable once created."""
    return {CLUSTER_LABEL: ref.name, ROLE_LABEL: component}


def labels(ref: ClusterRef, component: Component) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "kvferry",
        "app.kubernetes.io/instance": ref.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "kvferry",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        **selector_labels(ref, component),
    }


def owner_reference(ref: ClusterRef) -> dict[str, Any]:
    # controller=true marks the InferenceCluster as the one owner that manages the child; the garbage
    # collector deletes children once it is gone, which is the whole of the deletion logic.
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": ref.name,
        "uid": ref.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(ref: ClusterRef, component: Component, name: str | None = None) -> dict[str, Any]:
    return {
        "name": name or ref.child_name(component),
        "namespace": ref.namespace,
        "labels": labels(ref, component),
        "ownerReferences": [owner_reference(ref)],
    }


def controller_owner(body: Mapping[str, Any]) -> str | None:
    """Name of the InferenceCluster that controls this child, if one does."""
    for owner in body.get("metadata", {}).get("ownerReferences", []) or []:
        if owner.get("controller") and owner.get("kind") == KIND and owner.get("apiVersion") == API_VERSION:
            return str(owner["name"])
    return None
