"""Services: a headless one per node role (pods are addressed one by one), and the router's front door."""

from __future__ import annotations

from typing import Any

from kvferry.operator.build_config import NODE_PORT
from kvferry.operator.crd_model import InferenceClusterSpec
from kvferry.operator.naming import ClusterRef, NodeRole, child_metadata, selector_labels


def build_node_service(ref: ClusterRef, role: NodeRole) -> dict[str, Any]:
    # Headless: the router picks a specific prefill and decode node, so it needs every pod's address
    # (EndpointSlices, DNS A records), not a virtual IP that load-balances.
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(ref, role),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(ref, role),
            "ports": [{"name": "http", "port": NODE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_router_service(ref: ClusterRef, spec: InferenceClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(ref, "router"),
        "spec": {
            "type": spec.router.service_type,
            "selector": selector_labels(ref, "router"),
            "ports": [{"name": "http", "port": spec.router.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def router_endpoint(ref: ClusterRef, spec: InferenceClusterSpec, service: dict[str, Any] | None) -> str:
    """The URL clients use: the load balancer's address once it has one, else the in-cluster DNS name."""
    ingress = ((service or {}).get("status", {}).get("loadBalancer", {}).get("ingress") or [{}])[0]
    host = ingress.get("ip") or ingress.get("hostname")
    if spec.router.service_type == "LoadBalancer" and host:
        return f"http://{host}:{spec.router.port}"
    return f"http://{ref.child_name('router')}.{ref.namespace}.svc:{spec.router.port}"
