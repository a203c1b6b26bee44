"""Every object one InferenceCluster owns, in the order they are applied.

Dependencies first: the router's RBAC and the ConfigMap exist before the pods that use them, and the
Deployments come last so that a reconcile cut short leaves no pod waiting on a missing volume.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvferry.operator.build_config import build_config_map, config_hash
from kvferry.operator.build_disruption import build_disruption_budget
from kvferry.operator.build_rbac import (
    build_router_role,
    build_router_role_binding,
    build_router_service_account,
)
from kvferry.operator.build_redis import build_redis_deployment, build_redis_service
from kvferry.operator.build_services import build_node_service, build_router_service
from kvferry.operator.build_workloads import build_role_deployment
from kvferry.operator.crd_model import InferenceClusterSpec
from kvferry.operator.naming import NODE_ROLES, SERVING_ROLES, ClusterRef
from kvferry.operator.replica_counts import desired_replicas

# (apiVersion, kind) of everything build_children may return: what the operator applies and prunes.
CHILD_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "ServiceAccount"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("policy/v1", "PodDisruptionBudget"),
    ("apps/v1", "Deployment"),
)


def build_children(ref: ClusterRef, spec: InferenceClusterSpec, decided: Mapping[str, int]) -> list[dict[str, Any]]:
    """`decided`: the autoscaling planner's counts, by role (replica_counts.decided_counts)."""
    config_map = build_config_map(ref, spec)
    digest = config_hash(config_map)
    children = [
        build_router_service_account(ref),
        build_router_role(ref),
        build_router_role_binding(ref),
        config_map,
    ]
    if spec.redis.managed:
        children += [build_redis_service(ref), build_redis_deployment(ref, spec)]
    children += [build_node_service(ref, role) for role in NODE_ROLES]
    children.append(build_router_service(ref, spec))
    children += [build_disruption_budget(ref, role) for role in SERVING_ROLES]
    replicas = desired_replicas(spec, decided)
    children += [build_role_deployment(ref, spec, role, digest, replicas[role]) for role in SERVING_ROLES]
    return children
