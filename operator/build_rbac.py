"""The router's ServiceAccount, Role and RoleBinding: just enough to discover nodes by label.

The router watches pods and EndpointSlices of its own namespace; it reads nothing else and writes nothing.
"""

from __future__ import annotations

from typing import Any

from kvferry.operator.naming import ClusterRef, child_metadata

ROUTER_DISCOVERY_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
)


def router_service_account_name(ref: ClusterRef) -> str:
    return ref.child_name("router")


def build_router_service_account(ref: ClusterRef) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": child_metadata(ref, "router")}


def build_router_role(ref: ClusterRef) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": child_metadata(ref, "router"),
        "rules": [dict(rule) for rule in ROUTER_DISCOVERY_RULES],
    }


def build_router_role_binding(ref: ClusterRef) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": child_metadata(ref, "router"),
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": ref.child_name("router"),
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": router_service_account_name(ref), "namespace": ref.namespace}
        ],
    }
