"""Leader election on a coordination.k8s.io Lease, so that only one operator replica reconciles.

Same protocol as client-go's leaderelection: the holder renews `renewTime` every few seconds; a
candidate takes the lease over only after it has seen the record unchanged for a full lease duration
(measured on its own monotonic clock, so clocks need not agree), and every write carries the
resourceVersion it read, so two candidates cannot both win. A leader that fails to renew within the
renew deadline stops reconciling and exits; the Deployment restarts it as a candidate.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from kvferry.operator.kube import Kube

LEASE_API_VERSION = "coordination.k8s.io/v1"
logger = logging.getLogger("kvferry.operator.leader")


def _micro_time(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaseElector:
    kube: Kube
    name: str
    namespace: str
    identity: str
    duration_s: float
    # The uid of the pod this replica runs in (the identity is its name): every write makes that pod the
    # Lease's owner, so the Lease goes with the last pod that held it, `helm uninstall` included, even
    # when a terminating replica writes it once more. None outside a pod: the Lease then stays.
    pod_uid: str | None = None
    leading: bool = field(default=False, init=False)
    _observed: tuple[Any, ...] | None = field(default=None, init=False)
    _observed_at: float = field(default=0.0, init=False)

    @property
    def retry_period_s(self) -> float:
        return max(self.duration_s / 5, 0.5)

    @property
    def renew_deadline_s(self) -> float:
        return self.duration_s * 2 / 3

    def _lease(self, spec: dict[str, Any], resource_version: str | None = None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        if self.pod_uid:
            metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": self.identity, "uid": self.pod_uid}]
        return {"apiVersion": LEASE_API_VERSION, "kind": "Lease", "metadata": metadata, "spec": spec}

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True while this process holds the lease."""
        now = datetime.now(UTC)
        try:
            current = self.kube.get(LEASE_API_VERSION, "Lease", self.namespace, self.name)
            if current is None:
                spec = {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": max(1, round(self.duration_s)),
                    "acquireTime": _micro_time(now),
                    "renewTime": _micro_time(now),
                    "leaseTransitions": 0,
                }
                self.kube.create(self._lease(spec))
                return True
            spec = dict(current.get("spec") or {})
            holder = spec.get("holderIdentity") or ""
            record = (holder, spec.get("renewTime"), spec.get("leaseDurationSeconds"))
            if record != self._observed:
                self._observed, self._observed_at = record, time.monotonic()
            held_by_other = holder and holder != self.identity
            duration = float(spec.get("leaseDurationSeconds") or self.duration_s)
            if held_by_other and time.monotonic() - self._observed_at < duration:
                return False
            if holder != self.identity:
                spec["acquireTime"] = _micro_time(now)
                spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            spec.update(
                holderIdentity=self.identity,
                leaseDurationSeconds=max(1, round(self.duration_s)),
                renewTime=_micro_time(now),
            )
            self.kube.replace(self._lease(spec, current["metadata"]["resourceVersion"]))
            return True
        except ApiException as error:
            # 409: another candidate wrote first; anything else: try again next period.
            if error.status != 409:
                logger.warning("lease %s/%s: %s %s", self.namespace, self.name, error.status, error.reason)
            return False

    def release(self) -> None:
        """Hand the lease over at once on a clean exit instead of making the next leader wait it out."""
        try:
            current = self.kube.get(LEASE_API_VERSION, "Lease", self.namespace, self.name)
            if current and (current.get("spec") or {}).get("holderIdentity") == self.identity:
                spec = {**current["spec"], "holderIdentity": "", "leaseDurationSeconds": 1}
                self.kube.replace(self._lease(spec, current["metadata"]["resourceVersion"]))
        except ApiException as error:
            logger.warning("could not release lease %s/%s: %s", self.namespace, self.name, error.reason)


def run_as_leader(
    elector: LeaseElector, lead: Callable[[threading.Event], int], stop: threading.Event
) -> int:
    """Wait for the lease, then run `lead(lost)`; `lost` is set when renewing fails past the deadline.

    Returns lead's exit code, 1 when leadership was lost, or 0 when `stop` is set while still waiting.
    """
    logger.info("waiting for lease %s/%s as %s", elector.namespace, elector.name, elector.identity)
    while not elector.try_acquire_or_renew():
        if stop.wait(elector.retry_period_s):
            return 0
    logger.info("acquired lease %s/%s", elector.namespace, elector.name)
    if stop.is_set():
        elector.release()
        return 0
    elector.leading = True
    lost = threading.Event()
    done = threading.Event()

    def renew() -> None:
        last_renewed = time.monotonic()
        while not done.wait(elector.retry_period_s):
            if elector.try_acquire_or_renew():
                last_renewed = time.monotonic()
            elif time.monotonic() - last_renewed > elector.renew_deadline_s:
                logger.error("lost lease %s/%s; stopping", elector.namespace, elector.name)
                elector.leading = False
                lost.set()
                return

    renewer = threading.Thread(target=renew, name="lease-renewer", daemon=True)
    renewer.start()
    try:
        code = lead(lost)
    finally:
        done.set()
        renewer.join()
        if not lost.is_set():
            elector.release()
            elector.leading = False
    return 1 if lost.is_set() else code
