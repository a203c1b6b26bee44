"""The autoscaling loop: once an interval, for each InferenceCluster with autoscaling, scrape the metrics of
its routers and nodes, let the planner (planner/) decide each autoscaled role's count, record the decision
in status (and an Event when the count changes), and reconcile so that the Deployment follows.

A thread beside kopf, like resync.py and for the same reason (a kopf timer puts a finalizer on every
object). The planner's memory (the last scrape's counters, each role's PlannerState) lives in this
process: a restarted or newly elected operator starts afresh and holds each count until it has learnt
again, which errs on the side of capacity. Scrapes go to the pods' own addresses (the operator needs no
Prometheus); a pod that does not answer within the timeout is left out of that interval.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import httpx
from kubernetes.client.exceptions import ApiException

from kvferry.operator.build_config import NODE_PORT
from kvferry.operator.crd_model import AutoscaledRole, InferenceClusterSpec
from kvferry.operator.kube import Kube
from kvferry.operator.naming import API_VERSION, CLUSTER_LABEL, KIND, MANAGED_BY, ROLE_LABEL, ClusterRef
from kvferry.operator.planner.plan import Decision, PlannerState, plan
from kvferry.operator.planner.readings import (
    NodeGauges,
    PrefillPhases,
    RouterTotals,
    decode_observation,
    prefill_observation,
)
from kvferry.operator.reconcile import ReconcileSettings, reconcile, write_status
from kvferry.operator.replica_counts import (
    autoscaling_of,
    decided_counts,
    desired_replicas,
    recorded_decisions,
)
from kvferry.operator.resync import list_clusters
from kvferry.operator.validation import InvalidSpec, parse_spec

logger = logging.getLogger("kvferry.operator")

SCRAPE_TIMEOUT_S = 2.0
AUTOSCALED_ROLES = ("prefill", "decode")
Fetch = Callable[[list[str]], list[str]]  # /metrics URLs -> the texts of those that answered


def fetch_metrics(urls: list[str]) -> list[str]:
    texts = []
    # A TLS pod's certificate is not checked: a router's CA is the user's, not the operator's, a node's names
    # no pod IP, and a scrape sends nothing secret.
    with httpx.Client(timeout=SCRAPE_TIMEOUT_S, verify=False) as client:
        for url in urls:
            try:
                response = client.get(url)
                response.raise_for_status()
            except httpx.HTTPError as error:
                logger.info("autoscaling: %s did not answer: %s", url, error)
                continue
            texts.append(response.text)
    return texts


@dataclass
class _ClusterMemory:
    totals: RouterTotals
    phases: PrefillPhases
    at_s: float
    states: dict[str, PlannerState] = field(default_factory=dict)


class Autoscaler:
    def __init__(self, kube: Kube, namespaces: tuple[str, ...], settings: ReconcileSettings,
                 fetch: Fetch = fetch_metrics, clock: Callable[[], float] = time.monotonic) -> None:
        self._kube, self._namespaces, self._settings = kube, namespaces, settings
        self._fetch, self._clock = fetch, clock
        self._memory: dict[str, _ClusterMemory] = {}  # by the cluster's uid

    def run_once(self) -> None:
        """One interval for every cluster; one cluster's failure does not stop the others."""
        seen = set()
        for body in list_clusters(self._kube, self._namespaces):
            ref = ClusterRef.from_body(body)
            try:
                spec = parse_spec(body.get("spec"))
            except InvalidSpec:
                continue  # reconcile reports it
            if body["metadata"].get("deletionTimestamp") or all(
                autoscaling_of(spec, role) is None for role in AUTOSCALED_ROLES
            ):
                continue
            seen.add(ref.uid)
            try:
                self._interval(ref, body, spec)
            except ApiException as error:
                logger.warning("autoscaling %s/%s failed: %s %s", ref.namespace, ref.name, error.status, error.reason)
        for uid in set(self._memory) - seen:  # deleted, or autoscaling turned off: forget
            del self._memory[uid]

    def _interval(self, ref: ClusterRef, body: Mapping[str, Any], spec: InferenceClusterSpec) -> None:
        texts = {role: self._fetch(self._metrics_urls(ref, role, spec)) for role in ("router", *AUTOSCALED_ROLES)}
        now, totals, phases = self._clock(), RouterTotals.of(texts["router"]), PrefillPhases.of(texts["prefill"])
        last = self._memory.get(ref.uid)
        memory = self._memory[ref.uid] = _ClusterMemory(totals, phases, now, last.states if last else {})
        if last is None or now <= last.at_s:
            return  # the first scrape bounds no interval yet
        counts = desired_replicas(spec, decided_counts(body.get("status")))
        decisions = {}
        for role in AUTOSCALED_ROLES:
            scaling = autoscaling_of(spec, role)
            if scaling is None:
                memory.states.pop(role, None)
                continue
            gauges = NodeGauges.of(texts[role])
            seen = (prefill_observation(now, now - last.at_s, last.totals, totals, gauges, last.phases, phases)
                    if role == "prefill"
                    else decode_observation(now, last.totals, totals, gauges))
            # the count in force is the truth (a spec's bounds may have moved it since the last decision)
            count = counts[role]
            assert count is not None  # autoscaling excludes scaleExternally (crd_model.AutoscaledRoleSpec)
            state = replace(memory.states.get(role) or PlannerState.fresh(count, now), replicas=count)
            decisions[role] = plan(scaling.policy(), state, seen)
            memory.states[role] = decisions[role].state
            # The interval's own recommendation leads the line: what a reader of the log (or a test timing
            # the scale-down window) needs to find the last interval that asked for a count.
            logger.info("autoscaling %s/%s %s: %d recommended; %s", ref.namespace, ref.name, role,
                        decisions[role].recommended, decisions[role].reason)
        self._record(ref, body, counts, decisions)

    def _metrics_urls(self, ref: ClusterRef, role: str, spec: InferenceClusterSpec) -> list[str]:
        pods = self._kube.list("v1", "Pod", ref.namespace, f"{CLUSTER_LABEL}={ref.name},{ROLE_LABEL}={role}")
        tls = spec.router.tls_secret is not None if role == "router" else spec.internal_tls is not None
        scheme = "https" if tls else "http"
        return [f"{scheme}://{pod['status']['podIP']}:{NODE_PORT}/metrics" for pod in pods if _serving(pod)]

    def _record(self, ref: ClusterRef, body: Mapping[str, Any], counts: Mapping[str, int | None],
                decisions: Mapping[str, Decision]) -> None:
        stamp = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        previous = recorded_decisions(body.get("status")).model_dump(by_alias=True, mode="json")
        changed = {role: d for role, d in decisions.items() if d.replicas != counts[role]}
        recorded = {
            role: AutoscaledRole(
                replicas=d.replicas, recommended=d.recommended, reason=d.reason,
                last_scale_time=stamp if role in changed else (previous.get(role) or {}).get("lastScaleTime"),
            ).model_dump(by_alias=True, mode="json")
            for role, d in decisions.items()
        }
        write_status(self._kube, ref, lambda parent: {"autoscaling": recorded})
        if not changed:
            return
        for role, decision in changed.items():
            self._post_event(ref, f"{role}: {decision.reason}", stamp)
        fresh = self._kube.get(API_VERSION, KIND, ref.namespace, ref.name)
        if fresh is not None:
            reconcile(self._kube, fresh, self._settings)

    def _post_event(self, ref: ClusterRef, message: str, stamp: str) -> None:
        self._kube.create({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{ref.name}-autoscaling-", "namespace": ref.namespace},
            "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": ref.name,
                               "namespace": ref.namespace, "uid": ref.uid},
            "reason": "Autoscaled",
            "message": message[:1024],
            "type": "Normal",
            "source": {"component": MANAGED_BY},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        })


def _serving(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return ready and bool(status.get("podIP")) and not pod["metadata"].get("deletionTimestamp")


def autoscale_until(autoscaler: Autoscaler, interval_s: float, stop: threading.Event) -> None:
    """Run one interval every `interval_s` seconds until `stop` is set."""
    while not stop.wait(interval_s):
        try:
            autoscaler.run_once()
        except ApiException as error:  # the list itself failed (apiserver away): try again next interval
            logger.warning("autoscaling: listing InferenceClusters failed: %s %s", error.status, error.reason)
        except Exception:  # a bug must show, but must not end autoscaling for good
            logger.exception("autoscaling failed")

