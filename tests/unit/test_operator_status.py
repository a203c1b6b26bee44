"""Status from children: phases, conditions, counts and transition times."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kvferry.operator.naming import ClusterRef
from kvferry.operator.status import Problem, compute_status
from kvferry.operator.validation import parse_spec

REF = ClusterRef(name="demo", namespace="serving", uid="u")
T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
T1 = datetime(2025, 1, 1, 12, 5, 0, tzinfo=UTC)


def spec(**overrides: Any):
    """One router, where the default is two: the cases' Deployments have one pod per role."""
    return parse_spec({"model": {"source": "/m", "servedName": "m"}, "router": {"replicas": 1}, **overrides})


def deployment(replicas: int, ready: int, updated: int | None = None, total: int | None = None, **extra: Any):
    status = {
        "observedGeneration": extra.pop("observed", 2),
        "replicas": replicas if total is None else total,
        "updatedReplicas": replicas if updated is None else updated,
        "readyReplicas": ready,
        **extra,
    }
    return {"metadata": {"generation": 2}, "spec": {"replicas": replicas}, "status": status}


def status_of(deployments: dict[str, Any], s=None, problem=None, previous=None, now=T0) -> dict[str, Any]:
    return compute_status(
        ref=REF,
        spec=spec() if s is None and problem is None else s,
        problem=problem,
        deployments=deployments,
        router_service=None,
        previous=previous or {},
        observed_generation=7,
        now=now,
    )


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_nothing_created_yet_is_pending() -> None:
    status = status_of({"prefill": None, "decode": None, "router": None})
    assert status["phase"] == "Pending"
    assert conditions(status) == {
        "Ready": ("False", "ReplicasNotReady"),
        "Progressing": ("True", "RollingOut"),
        "Degraded": ("False", "AsExpected"),
    }
    assert status["prefill"] == {"desired": 1, "ready": 0, "updated": 0}
    assert status["observedGeneration"] == 7
    assert status["routerEndpoint"] == "http://demo-router.serving.svc:8000"


def test_all_replicas_ready_is_ready() -> None:
    s = spec(prefill={"replicas": 3}, decode={"replicas": 2})
    status = status_of(
        {"prefill": deployment(3, 3), "decode": deployment(2, 2), "router": deployment(1, 1)}, s
    )
    assert status["phase"] == "Ready"
    assert conditions(status)["Ready"] == ("True", "AllReplicasReady")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"] == "prefill 3/3, decode 2/2, router 1/1 ready"
    assert ready["observedGeneration"] == 7
    assert (status["prefill"], status["decode"]) == (
        {"desired": 3, "ready": 3, "updated": 3},
        {"desired": 2, "ready": 2, "updated": 2},
    )


def test_some_ready_is_progressing() -> None:
    s = spec(prefill={"replicas": 3})
    status = status_of(
        {"prefill": deployment(3, 1), "decode": deployment(1, 1), "router": deployment(1, 1)}, s
    )
    assert status["phase"] == "Progressing"
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["message"] == "waiting for prefill 3/3 updated, 1 ready"


def test_rollout_with_old_pods_left_is_not_ready() -> None:
    # Ready count is right, but two of the pods still run the old template.
    rolling = {
        "prefill": deployment(1, 1, updated=1, total=2),
        "decode": deployment(1, 1),
        "router": deployment(1, 1),
    }
    assert status_of(rolling)["phase"] == "Progressing"
    progressing = next(c for c in status_of(rolling)["conditions"] if c["type"] == "Progressing")
    assert progressing["message"] == "waiting for prefill 1/1 updated, 1 ready, 1 outdated"
    stale = {"prefill": deployment(1, 1, observed=1), "decode": deployment(1, 1), "router": deployment(1, 1)}
    assert status_of(stale)["phase"] == "Progressing"


def test_spec_replicas_not_yet_applied_is_not_ready() -> None:
    s = spec(prefill={"replicas": 3})
    status = status_of(
        {"prefill": deployment(1, 1), "decode": deployment(1, 1), "router": deployment(1, 1)}, s
    )
    assert status["phase"] == "Progressing"
    assert status["prefill"]["desired"] == 3


def test_invalid_spec_is_degraded_with_its_message() -> None:
    problem = Problem("InvalidSpec", "spec.model.source: 'x' is a relative path")
    status = status_of({"prefill": deployment(2, 2), "decode": None, "router": None}, problem=problem)
    assert status["phase"] == "Degraded"
    assert conditions(status) == {
        "Ready": ("False", "InvalidSpec"),
        "Progressing": ("False", "InvalidSpec"),
        "Degraded": ("True", "InvalidSpec"),
    }
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["message"] == "spec.model.source: 'x' is a relative path"
    assert status["prefill"] == {
        "desired": 2,
        "ready": 2,
        "updated": 2,
    }  # from the Deployment that still runs


def test_deployment_failure_is_degraded() -> None:
    stuck = deployment(
        1,
        0,
        conditions=[
            {
                "type": "Progressing",
                "status": "False",
                "reason": "ProgressDeadlineExceeded",
                "message": "too slow",
            }
        ],
    )
    status = status_of({"prefill": stuck, "decode": deployment(1, 1), "router": deployment(1, 1)})
    assert status["phase"] == "Degraded"
    assert conditions(status)["Degraded"] == ("True", "ProgressDeadlineExceeded")
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["message"] == "Deployment prefill: too slow"


def test_managed_redis_must_be_ready_too() -> None:
    s = spec(redis={"managed": True})
    children = {
        "prefill": deployment(1, 1),
        "decode": deployment(1, 1),
        "router": deployment(1, 1),
        "redis": deployment(1, 0),
    }
    assert status_of(children, s)["phase"] == "Progressing"
    children["redis"] = deployment(1, 1)
    assert status_of(children, s)["phase"] == "Ready"


def test_transition_time_moves_only_when_the_status_changes() -> None:
    children = {"prefill": deployment(1, 0), "decode": deployment(1, 1), "router": deployment(1, 1)}
    first = status_of(children, now=T0)
    again = status_of(children, previous=first, now=T1)
    assert [c["lastTransitionTime"] for c in again["conditions"]] == ["2025-01-01T12:00:00Z"] * 3
    children["prefill"] = deployment(1, 1)
    ready = status_of(children, previous=again, now=T1)
    times = {c["type"]: c["lastTransitionTime"] for c in ready["conditions"]}
    assert times == {
        "Ready": "2025-01-01T12:05:00Z",
        "Progressing": "2025-01-01T12:05:00Z",
        "Degraded": "2025-01-01T12:00:00Z",
    }


DECODE_AUTOSCALED = {"replicas": 1, "autoscaling": {"minReplicas": 2, "maxReplicas": 5, "itlP90Seconds": 0.05}}


def _decision(replicas: int) -> dict[str, Any]:
    return {"replicas": replicas, "recommended": replicas, "reason": "scale up 2 -> 4: test"}


def test_an_autoscaled_role_wants_the_planners_count_and_keeps_its_decision() -> None:
    previous = {"autoscaling": {"decode": _decision(4)}}
    status = status_of({"prefill": deployment(1, 1), "decode": deployment(2, 2), "router": deployment(1, 1)},
                       spec(decode=DECODE_AUTOSCALED), previous=previous)
    assert status["decode"]["desired"] == 4
    assert status["phase"] == "Progressing"
    assert status["autoscaling"]["decode"]["replicas"] == 4  # a reconcile's status does not erase it


def test_before_any_decision_an_autoscaled_role_starts_within_its_bounds() -> None:
    status = status_of({"prefill": deployment(1, 1), "decode": deployment(1, 1), "router": deployment(1, 1)},
                       spec(decode=DECODE_AUTOSCALED))
    assert status["decode"]["desired"] == 2  # replicas 1 is below minReplicas 2
    assert status["autoscaling"] is None


def test_removing_autoscaling_drops_its_decision_and_the_spec_count_rules() -> None:
    previous = {"autoscaling": {"decode": _decision(4)}}
    status = status_of({"prefill": deployment(1, 1), "decode": deployment(4, 4), "router": deployment(1, 1)},
                       spec(decode={"replicas": 1}), previous=previous)
    assert status["decode"]["desired"] == 1
    assert status["autoscaling"] is None


def test_a_role_scaled_externally_wants_its_deployments_own_count() -> None:
    """An HPA scaled decode to 3 through the Deployment's /scale: the status follows it, not replicas: 1."""
    status = status_of({"prefill": deployment(1, 1), "decode": deployment(3, 3), "router": deployment(1, 1)},
                       spec(decode={"replicas": 1, "scaleExternally": True}))
    assert status["decode"]["desired"] == 3
    assert status["phase"] == "Ready"
