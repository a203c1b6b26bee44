"""InferenceCluster status computed from its children: a pure function, so every rule has a unit test.

Phases: Pending (no pod Ready yet), Progressing (rolling out or scaling), Ready (every role has all its
replicas Ready on the current template), Degraded (the spec cannot be built, or a Deployment reports a
failure). Conditions keep their lastTransitionTime while their status does not change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvferry.operator.build_services import router_endpoint
from kvferry.operator.crd_model import Condition, InferenceClusterSpec, InferenceClusterStatus, RoleStatus
from kvferry.operator.naming import SERVING_ROLES, ClusterRef
from kvferry.operator.replica_counts import decided_counts, desired_replicas, kept_decisions


@dataclass(frozen=True)
class Problem:
    """Why the operator could not reconcile the current spec (reason is CamelCase, message names the field)."""

    reason: str
    message: str


@dataclass(frozen=True)
class Rollout:
    """One Deployment as far as readiness goes."""

    name: str
    desired: int
    ready: int
    updated: int
    outdated: int  # pods of an older template still there (a rollout replaces them one by one)
    complete: bool
    failure: Problem | None


def rollout_of(name: str, deployment: Mapping[str, Any] | None, desired: int | None) -> Rollout:
    """desired: the spec's replica count; None takes the Deployment's own (when the spec is unusable)."""
    if deployment is None:
        return Rollout(name, desired or 0, 0, 0, 0, complete=False, failure=None)
    status = deployment.get("status", {})
    if desired is None:
        desired = int(deployment.get("spec", {}).get("replicas", 1))
    ready = int(status.get("readyReplicas", 0))
    updated = int(status.get("updatedReplicas", 0))
    caught_up = int(status.get("observedGeneration", 0)) >= int(deployment["metadata"].get("generation", 1))
    # status.replicas counts old pods as well: a rollout is over once only updated, ready pods remain.
    complete = (
        caught_up
        and int(deployment["spec"].get("replicas", 1)) == desired
        and updated == desired
        and ready == desired
        and int(status.get("replicas", 0)) == desired
    )
    outdated = max(0, int(status.get("replicas", 0)) - updated)
    return Rollout(name, desired, ready, updated, outdated, complete, _failure(name, status.get("conditions") or []))


def _failure(name: str, conditions: Sequence[Mapping[str, Any]]) -> Problem | None:
    for condition in conditions:
        stuck = condition.get("type") == "Progressing" and condition.get("status") == "False"
        failed = condition.get("type") == "ReplicaFailure" and condition.get("status") == "True"
        if stuck or failed:
            reason = condition.get("reason") or condition["type"]
            return Problem(reason, f"Deployment {name}: {condition.get('message', reason)}")
    return None


def _phase(problem: Problem | None, rollouts: Sequence[Rollout]) -> str:
    if problem is not None:
        return "Degraded"
    if all(rollout.complete for rollout in rollouts):
        return "Ready"
    if not any(rollout.ready for rollout in rollouts):
        return "Pending"
    return "Progressing"


def _summary(rollouts: Sequence[Rollout]) -> str:
    return ", ".join(f"{rollout.name} {rollout.ready}/{rollout.desired}" for rollout in rollouts) + " ready"


def _conditions(
    phase: str, problem: Problem | None, rollouts: Sequence[Rollout]
) -> list[tuple[str, bool, str, str]]:
    summary = _summary(rollouts)
    # A rollout's progress is its updated pods; a scale's, its ready ones: both are said.
    waiting = ", ".join(f"{r.name} {r.updated}/{r.desired} updated, {r.ready} ready"
                        + (f", {r.outdated} outdated" if r.outdated else "") for r in rollouts if not r.complete)
    if problem is not None:
        return [
            ("Ready", False, problem.reason, summary),
            ("Progressing", False, problem.reason, problem.message),
            ("Degraded", True, problem.reason, problem.message),
        ]
    if phase == "Ready":
        return [
            ("Ready", True, "AllReplicasReady", summary),
            ("Progressing", False, "RolloutComplete", summary),
            ("Degraded", False, "AsExpected", ""),
        ]
    return [
        ("Ready", False, "ReplicasNotReady", summary),
        ("Progressing", True, "RollingOut", f"waiting for {waiting}"),
        ("Degraded", False, "AsExpected", ""),
    ]


def _with_transition_times(
    computed: list[tuple[str, bool, str, str]],
    previous: Sequence[Mapping[str, Any]],
    observed_generation: int,
    now: datetime,
) -> list[Condition]:
    before = {c.get("type"): c for c in previous}
    conditions = []
    for kind, holds, reason, message in computed:
        status = "True" if holds else "False"
        earlier = before.get(kind, {})
        changed = earlier.get("status") != status
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ") if changed else earlier["lastTransitionTime"]
        conditions.append(
            Condition(
                type=kind,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=stamp,
                observed_generation=observed_generation,
            )
        )
    return conditions


def _role_status(rollout: Rollout) -> RoleStatus:
    return RoleStatus(desired=rollout.desired, ready=rollout.ready, updated=rollout.updated)


def compute_status(
    *,
    ref: ClusterRef,
    spec: InferenceClusterSpec | None,
    problem: Problem | None,
    deployments: Mapping[str, Mapping[str, Any] | None],
    router_service: Mapping[str, Any] | None,
    previous: Mapping[str, Any],
    observed_generation: int,
    now: datetime,
) -> dict[str, Any]:
    """deployments: by component (prefill, decode, router, and redis when managed); None when missing."""
    desired: dict[str, int] = dict(desired_replicas(spec, decided_counts(previous))) if spec else {}
    if spec is not None and spec.redis.managed:
        desired["redis"] = 1
    rollouts = {
        component: rollout_of(component, deployment, desired.get(component))
        for component, deployment in deployments.items()
    }
    if problem is None:
        problem = next((r.failure for r in rollouts.values() if r.failure is not None), None)
    phase = _phase(problem, list(rollouts.values()))
    computed = _conditions(phase, problem, list(rollouts.values()))
    endpoint = (
        router_endpoint(ref, spec, dict(router_service or {})) if spec else previous.get("routerEndpoint")
    )
    status = InferenceClusterStatus(
        phase=phase,
        conditions=tuple(
            _with_transition_times(computed, previous.get("conditions") or [], observed_generation, now)
        ),
        observed_generation=observed_generation,
        router_endpoint=endpoint,
        autoscaling=kept_decisions(spec, previous) if spec else previous.get("autoscaling"),
        **{role: _role_status(rollouts[role]) for role in SERVING_ROLES},
    )
    return status.model_dump(by_alias=True, mode="json")
