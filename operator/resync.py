"""Re-apply every InferenceCluster periodically, restoring children deleted or edited by hand.

Not a kopf timer: kopf puts a finalizer on every object that has a timer, so a stopped operator would
block the deletion of every InferenceCluster (and with it its namespace, and the CRD's). This loop holds
nothing on the objects: deletion never waits for the operator, and the garbage collector takes the children.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kubernetes.client.exceptions import ApiException

from kvferry.operator.kube import Kube
from kvferry.operator.naming import API_VERSION, KIND
from kvferry.operator.reconcile import ReconcileSettings, reconcile

logger = logging.getLogger("kvferry.operator")


def list_clusters(kube: Kube, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every InferenceCluster in `namespaces` (empty: in every namespace)."""
    if not namespaces:
        return kube.list(API_VERSION, KIND, None, "")
    return [body for namespace in namespaces for body in kube.list(API_VERSION, KIND, namespace, "")]


def resync_once(kube: Kube, namespaces: tuple[str, ...], settings: ReconcileSettings) -> None:
    """Reconcile each cluster that is not being deleted; one cluster's failure does not stop the others."""
    for body in list_clusters(kube, namespaces):
        meta = body["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        try:
            reconcile(kube, body, settings)
        except ApiException as error:  # transient (conflict, unavailable): the next period tries again
            logger.warning(
                "resync of %s/%s failed: %s %s", meta["namespace"], meta["name"], error.status, error.reason
            )
            continue
        logger.info("resynced %s/%s", meta["namespace"], meta["name"])


def resync_until(
    kube: Kube,
    namespaces: tuple[str, ...],
    settings: ReconcileSettings,
    interval_s: float,
    stop: threading.Event,
) -> None:
    """Run `resync_once` every `interval_s` seconds until `stop` is set; the first run after one interval."""
    while not stop.wait(interval_s):
        try:
            resync_once(kube, namespaces, settings)
        except ApiException as error:  # the list itself failed (apiserver away): try again next period
            logger.warning("resync: listing InferenceClusters failed: %s %s", error.status, error.reason)
        except Exception:  # a bug must show, but must not end the resyncs for good
            logger.exception("resync failed")
