"""How many pods each role runs: the spec's `replicas`, or, for a role with autoscaling, the planner's last
decision in status (the spec's count, within the bounds, until it has made one). The one place that
answers it, for the Deployments and for the status alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvferry.operator.crd_model import (
    AutoscaledRoleSpec,
    Autoscaling,
    AutoscalingStatus,
    InferenceClusterSpec,
)
from kvferry.operator.naming import SERVING_ROLES, ServingRole


def autoscaling_of(spec: InferenceClusterSpec, role: ServingRole) -> Autoscaling | None:
    role_spec = spec.role(role)
    return role_spec.autoscaling if isinstance(role_spec, AutoscaledRoleSpec) else None


def recorded_decisions(status: Mapping[str, Any] | None) -> AutoscalingStatus:
    """The planner's decisions as a status (from the apiserver) holds them."""
    return AutoscalingStatus.model_validate((status or {}).get("autoscaling") or {})


def decided_counts(status: Mapping[str, Any] | None) -> dict[str, int]:
    """The planner's counts recorded in a status, by role."""
    recorded = recorded_decisions(status).model_dump()
    return {role: decided["replicas"] for role, decided in recorded.items() if decided is not None}


def kept_decisions(spec: InferenceClusterSpec, status: Mapping[str, Any] | None) -> AutoscalingStatus | None:
    """The recorded decisions of the roles that still autoscale (a role whose autoscaling was removed
    drops its own); None when no role autoscales."""
    recorded = recorded_decisions(status)
    kept = AutoscalingStatus(
        prefill=recorded.prefill if spec.prefill.autoscaling is not None else None,
        decode=recorded.decode if spec.decode.autoscaling is not None else None,
    )
    return kept if kept.prefill is not None or kept.decode is not None else None


def desired_replicas(spec: InferenceClusterSpec, decided: Mapping[str, int]) -> dict[ServingRole, int | None]:
    """None for a role that scales externally (`scaleExternally`): its Deployment's own count stands."""
    counts: dict[ServingRole, int | None] = {}
    for role in SERVING_ROLES:
        role_spec, scaling = spec.role(role), autoscaling_of(spec, role)
        if role_spec.scale_externally:
            counts[role] = None
        elif scaling is not None:
            count = decided.get(role, role_spec.replicas)
            counts[role] = min(scaling.max_replicas, max(scaling.min_replicas, count))
        else:
            counts[role] = role_spec.replicas
    return counts
