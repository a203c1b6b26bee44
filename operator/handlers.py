"""kopf handlers: thin wrappers that hand the object to `reconcile` or `refresh_status`.

- create / update (of the spec) / resume (operator start): reconcile, which applies every child.
- events of owned Deployments: recompute status only, so readiness shows up as soon as pods change.
There are no delete handlers and no timers or daemons (kopf guards objects that have those with a
finalizer), hence no finalizer: owner references let the garbage collector remove the children, and a
stopped operator never blocks deletion. The periodic resync is resync.py's loop, outside kopf.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from kubernetes.client import Configuration

from kvferry.operator.connection import kopf_connection_info
from kvferry.operator.kube import Kube
from kvferry.operator.naming import GROUP, MANAGED_BY, PLURAL, VERSION, controller_owner
from kvferry.operator.reconcile import ReconcileSettings, reconcile, refresh_status

RETRY_BACKOFF_S = 5.0  # transient API errors only; spec errors are never retried


def build_registry(
    kube: Kube, configuration: Configuration, settings: ReconcileSettings
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(id="configure", registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # kopf's bookkeeping goes into our own annotations; status stays the schema's alone.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=GROUP, key="last-handled-configuration"
        )
        # No handler needs a finalizer; kopf removes one of this name that an older operator added.
        settings.persistence.finalizer = f"{GROUP}/finalizer"
        # The CRD is installed before the operator (chart crds/), so kopf need not watch CRDs and
        # namespaces at runtime, and the operator needs no permission to read them.
        settings.scanning.disabled = True
        settings.posting.level = logging.WARNING  # Kubernetes Events for problems, not for every success

    @kopf.on.login(id="login", registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf_connection_info(configuration)

    def on_spec(body: kopf.Body, **_: Any) -> None:
        reconcile(kube, body, settings)

    for cause, decorate in (("create", kopf.on.create), ("resume", kopf.on.resume)):
        decorate(
            GROUP, VERSION, PLURAL, id=f"reconcile-on-{cause}", backoff=RETRY_BACKOFF_S, registry=registry
        )(on_spec)
    kopf.on.update(
        GROUP,
        VERSION,
        PLURAL,
        field="spec",
        id="reconcile-on-update",
        backoff=RETRY_BACKOFF_S,
        registry=registry,
    )(on_spec)

    @kopf.on.event(
        "apps", "v1", "deployments", labels={"app.kubernetes.io/managed-by": MANAGED_BY}, registry=registry
    )
    def on_child_event(body: kopf.Body, **_: Any) -> None:
        owner = controller_owner(body)
        if owner is not None:
            refresh_status(kube, body["metadata"]["namespace"], owner)

    return registry
