"""Reconcile one InferenceCluster: validate, apply every child, prune leftovers, publish status.

Idempotent by construction: children have fixed names and are written with server-side apply, so
running it twice, or again after the process died half-way, converges on exactly one child of each kind.
Spec problems end as a Degraded status and a normal return, never as an exception that kopf would retry.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from kvferry.operator.children import CHILD_KINDS, build_children
from kvferry.operator.crd_model import InferenceClusterSpec
from kvferry.operator.internal_secret import ensure_internal_secret
from kvferry.operator.internal_tls import NoSigningSeed, build_internal_tls_secrets
from kvferry.operator.kube import Kube
from kvferry.operator.naming import API_VERSION, CLUSTER_LABEL, KIND, SERVING_ROLES, ClusterRef
from kvferry.operator.replica_counts import decided_counts
from kvferry.operator.status import Problem, compute_status
from kvferry.operator.validation import InvalidSpec, parse_spec

logger = logging.getLogger("kvferry.operator")

# Reasons that only a reconcile can establish or clear: a child event must not overwrite them.
RECONCILE_PROBLEMS = ("InvalidSpec", "ApplyFailed", "NoSigningSeed")
STATUS_WRITE_ATTEMPTS = 5


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class ReconcileSettings:
    # Test hook: sleep between child applies so a test can kill the operator in the middle of a reconcile.
    test_hook_apply_delay_s: float = 0.0
    # What the internal TLS certificates derive from (operator/certificates.py); None: mode selfSigned fails.
    signing_seed: bytes | None = field(default=None, repr=False)
    clock: Callable[[], datetime] = _now  # when the certificates' periods are reckoned from


def _key(manifest: Mapping[str, Any]) -> tuple[str, str, str]:
    return manifest["apiVersion"], manifest["kind"], manifest["metadata"]["name"]


def prune(kube: Kube, ref: ClusterRef, keep: list[dict[str, Any]]) -> None:
    """Delete children this cluster owns that the spec no longer asks for (e.g. Redis turned off)."""
    wanted = {_key(manifest) for manifest in keep}
    for api_version, kind in CHILD_KINDS:
        for item in kube.list(api_version, kind, ref.namespace, f"{CLUSTER_LABEL}={ref.name}"):
            owned = any(owner.get("uid") == ref.uid for owner in item["metadata"].get("ownerReferences", []))
            if owned and (api_version, kind, item["metadata"]["name"]) not in wanted:
                logger.info("deleting %s %s/%s", kind, ref.namespace, item["metadata"]["name"])
                kube.delete(api_version, kind, ref.namespace, item["metadata"]["name"])


def read_children(kube: Kube, ref: ClusterRef, spec: InferenceClusterSpec | None) -> dict[str, Any]:
    components = list(SERVING_ROLES) + (["redis"] if spec is not None and spec.redis.managed else [])
    return {
        "deployments": {
            c: kube.get("apps/v1", "Deployment", ref.namespace, ref.child_name(c)) for c in components
        },
        "router_service": kube.get("v1", "Service", ref.namespace, ref.child_name("router")),
    }


def write_status(
    kube: Kube,
    ref: ClusterRef,
    compute: Callable[[dict[str, Any]], dict[str, Any] | None],
) -> None:
    """Read the parent, compute its status, write it only if the parent did not change meanwhile.

    The resourceVersion in the patch makes the write conditional, so a slow writer holding an old view
    (say a child event racing a reconcile) retries on fresh data instead of overwriting newer status.
    Every decision is made on the parent read in the same attempt: `compute` returns None to leave
    that parent's status alone.
    """
    for _ in range(STATUS_WRITE_ATTEMPTS):
        parent = kube.get(API_VERSION, KIND, ref.namespace, ref.name)
        if (
            parent is None
            or parent["metadata"].get("uid") != ref.uid
            or parent["metadata"].get("deletionTimestamp")
        ):
            return
        status = compute(parent)
        if status is None or _unchanged(status, parent.get("status") or {}):
            return
        patch = {"metadata": {"resourceVersion": parent["metadata"]["resourceVersion"]}, "status": status}
        try:
            kube.patch_status(API_VERSION, KIND, ref.namespace, ref.name, patch)
            return
        except ApiException as error:
            if error.status != 409:
                raise
    logger.warning("status of %s/%s kept changing; leaving it to the next event", ref.namespace, ref.name)


def _unchanged(status: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    # Skipping identical writes keeps the parent's resourceVersion (and kopf's watch) quiet. A null in a
    # merge patch means "absent", so nested nulls compare equal to missing keys.
    return all(_without_nulls(current.get(key)) == _without_nulls(value) for key, value in status.items())


def _without_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    return value


def _status_computer(
    kube: Kube,
    ref: ClusterRef,
    spec: InferenceClusterSpec | None,
    problem: Problem | None,
    observed_generation: int | None,
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def compute(parent: dict[str, Any]) -> dict[str, Any]:
        previous = parent.get("status") or {}
        generation = (
            previous.get("observedGeneration", 0) if observed_generation is None else observed_generation
        )
        return compute_status(
            ref=ref,
            spec=spec,
            problem=problem,
            previous=previous,
            observed_generation=generation,
            now=datetime.now(UTC),
            **read_children(kube, ref, spec),
        )

    return compute


def reconcile(kube: Kube, body: Mapping[str, Any], settings: ReconcileSettings) -> None:
    ref = ClusterRef.from_body(body)
    generation = int(body["metadata"].get("generation", 1))
    try:
        spec = parse_spec(body.get("spec"))
    except InvalidSpec as error:
        logger.warning("%s/%s: invalid spec: %s", ref.namespace, ref.name, error)
        write_status(
            kube, ref, _status_computer(kube, ref, None, Problem("InvalidSpec", str(error)), generation)
        )
        return
    try:
        # First: the pods mount it. Rebuilt as of now by every reconcile, resyncs included, which rotates it.
        secrets = build_internal_tls_secrets(ref, spec, settings.signing_seed, _created(body), settings.clock())
    except NoSigningSeed as error:
        logger.warning("%s/%s: %s", ref.namespace, ref.name, error)
        write_status(kube, ref, _status_computer(kube, ref, spec, Problem("NoSigningSeed", str(error)), generation))
        return
    children = secrets + build_children(ref, spec, decided_counts(body.get("status")))
    ensure_internal_secret(kube, ref)  # before the pods that read it
    problem = _apply_all(kube, children, settings)
    if problem is None:
        prune(kube, ref, children)
    write_status(kube, ref, _status_computer(kube, ref, spec, problem, generation))


def _created(body: Mapping[str, Any]) -> datetime:
    return datetime.fromisoformat(body["metadata"]["creationTimestamp"])


def _apply_all(kube: Kube, children: list[dict[str, Any]], settings: ReconcileSettings) -> Problem | None:
    for child in children:
        try:
            kube.apply(child)
        except ApiException as error:
            if error.status not in (400, 422):
                raise  # transient (conflict, unavailable, forbidden while RBAC propagates): kopf retries
            # The apiserver refused a child built from this spec; retrying the same spec cannot help.
            return Problem(
                "ApplyFailed", f"{child['kind']} {child['metadata']['name']}: {_api_message(error)}"
            )
        time.sleep(settings.test_hook_apply_delay_s)
    return None


def refresh_status(kube: Kube, namespace: str, name: str) -> None:
    """Recompute status after a child changed, without applying anything."""
    parent = kube.get(API_VERSION, KIND, namespace, name)
    if parent is None:
        return
    ref = ClusterRef.from_body(parent)
    write_status(kube, ref, lambda fresh: _refreshed_status(kube, ref, fresh))


def _refreshed_status(kube: Kube, ref: ClusterRef, parent: dict[str, Any]) -> dict[str, Any] | None:
    """The status a child's change gives this parent; None leaves it to the reconcile.

    Decided on the parent of the write attempt, not on an earlier read: a child event that read the parent
    before a reconcile wrote ApplyFailed would otherwise write a problem-free status over it, and the next
    resync would write ApplyFailed again (a settled object rewritten, seen as status churn in the e2e test).
    """
    if _reconcile_problem_stands(parent):
        return None
    try:
        spec = parse_spec(parent.get("spec"))
    except InvalidSpec:
        return None  # the reconcile of this generation reports it
    return _status_computer(kube, ref, spec, None, None)(parent)


def _reconcile_problem_stands(parent: Mapping[str, Any]) -> bool:
    status = parent.get("status") or {}
    if status.get("observedGeneration") != parent["metadata"].get("generation"):
        return False
    return any(
        c.get("type") == "Degraded" and c.get("status") == "True" and c.get("reason") in RECONCILE_PROBLEMS
        for c in status.get("conditions") or []
    )


def _api_message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body).get("message", error.reason))
    except (TypeError, ValueError):
        return str(error.reason)
