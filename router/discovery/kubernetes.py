"""Discovery from the Kubernetes API: the pods that match each role's label selector (as the operator
labels them: `kvferry.dev/cluster`, `kvferry.dev/role`), watched. A pod counts once it is Running and
Ready with an IP, and stops counting when it is not Ready or is being deleted.

The kubernetes client is synchronous: each role's list-then-watch loop runs in a thread of its own,
and `endpoints()` reads what the threads keep up to date. A watch resumes from the last resourceVersion
it saw (an event's, or a BOOKMARK's: bookmarks are asked for, so a quiet watch still moves on and its
version does not expire); only a failure lists again: a 410 Gone (the version expired), an ERROR event,
a lost connection. Lists in a row back off, doubling up to a bound, so an apiserver that keeps failing
is not hammered.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from kvferry.node.config import node_url
from kvferry.operator.naming import ROLE_LABEL
from kvferry.router.config import DiscoverySection
from kvferry.router.discovery.nodes import Endpoint, Role

log = logging.getLogger(__name__)
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
WATCH_SECONDS = 30  # a watch is re-opened this often, so a stop is noticed and a lost one recovers
FIRST_RELIST_SECONDS = 0.5
MAX_RELIST_SECONDS = 30.0
HTTP_GONE = 410


def pod_is_serving(pod: Any) -> bool:
    status = pod.status
    if pod.metadata.deletion_timestamp is not None or status is None or status.phase != "Running" or not status.pod_ip:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


class KubernetesDiscovery:
    def __init__(
        self, api: Any, namespace: str, selectors: dict[Role, dict[str, str]], port: int, watch_seconds: int = WATCH_SECONDS,
        scheme: str = "http",
    ) -> None:
        """`scheme`: how the router speaks to the nodes (https with internal TLS), in the URLs built from pod IPs."""
        self.api, self.namespace, self.selectors, self.port, self.scheme = api, namespace, selectors, port, scheme
        self.watch_seconds = watch_seconds
        self._pods: dict[Role, dict[str, str]] = {role: {} for role in selectors}  # role -> pod name -> URL
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    @classmethod
    def from_config(cls, settings: DiscoverySection, scheme: str) -> KubernetesDiscovery:
        from kubernetes import client, config

        if settings.kubeconfig:
            api_client = config.new_client_from_config(config_file=settings.kubeconfig)
        else:
            config.load_incluster_config()
            api_client = client.ApiClient()
        namespace = settings.namespace or (
            SERVICE_ACCOUNT_NAMESPACE.read_text().strip() if SERVICE_ACCOUNT_NAMESPACE.is_file() else "default"
        )
        selectors = settings.selectors or {role: {ROLE_LABEL: role} for role in ("prefill", "decode")}
        return cls(client.CoreV1Api(api_client), namespace, dict(selectors), settings.port, scheme=scheme)

    def endpoints(self) -> list[Endpoint]:
        with self._lock:
            return [Endpoint(url, role) for role, pods in self._pods.items() for url in sorted(pods.values())]

    def start(self) -> None:
        for role in self.selectors:
            thread = threading.Thread(target=self._watch_role, args=(role,), name=f"kvferry-discovery-{role}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stopping.set()

    def _url(self, pod: Any) -> str | None:
        return node_url(pod.status.pod_ip, self.port, self.scheme) if pod_is_serving(pod) else None

    def _apply(self, role: Role, pod: Any, deleted: bool) -> None:
        url = None if deleted else self._url(pod)
        with self._lock:
            if url is None:
                self._pods[role].pop(pod.metadata.name, None)
            else:
                self._pods[role][pod.metadata.name] = url

    def _list(self, role: Role, selector: str) -> str:
        """Every pod of the role, replacing what the watch had seen; the version to watch from."""
        listed = self.api.list_namespaced_pod(self.namespace, label_selector=selector)
        pods = {pod.metadata.name: url for pod in listed.items if (url := self._url(pod)) is not None}
        with self._lock:
            self._pods[role] = pods
        return str(listed.metadata.resource_version)

    def _watch(self, role: Role, selector: str, version: str) -> str:
        """One watch from `version` until the apiserver ends it; the last version seen, to resume from."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        stream = watch.Watch().stream(
            self.api.list_namespaced_pod, self.namespace, label_selector=selector, resource_version=version,
            timeout_seconds=self.watch_seconds, allow_watch_bookmarks=True,
        )
        for event in stream:
            kind, raw = event["type"], event["raw_object"]  # raw_object: the dict every event type has
            if kind == "ERROR":  # a Status, e.g. 410 Gone once the version has expired
                raise ApiException(status=raw.get("code"), reason=raw.get("message"))
            version = raw["metadata"]["resourceVersion"]
            if kind == "BOOKMARK":  # an object with nothing but its resourceVersion: not a pod
                log.debug("watching %s pods: bookmark at %s", role, version)
            else:
                self._apply(role, event["object"], deleted=kind == "DELETED")
            if self._stopping.is_set():
                break
        return version

    def _watch_role(self, role: Role) -> None:
        from kubernetes.client.exceptions import ApiException

        selector = label_selector(self.selectors[role])
        relists = 0  # lists since a watch last ran to its end: each waits twice as long as the one before
        while not self._stopping.is_set():
            try:
                version = self._list(role, selector)
                while not self._stopping.is_set():
                    version = self._watch(role, selector, version)
                    relists = 0
            except ApiException as exc:
                if exc.status == HTTP_GONE:
                    log.info("watching %s pods (%s): version expired; listing again", role, selector)
                else:
                    log.warning("watching %s pods (%s) failed: %s %s; listing again", role, selector, exc.status, exc.reason)
            except Exception as exc:  # noqa: BLE001 - the API server restarting must not end discovery
                log.warning("watching %s pods (%s) failed: %r; listing again", role, selector, exc)
            self._stopping.wait(min(MAX_RELIST_SECONDS, FIRST_RELIST_SECONDS * 2**relists))
            relists += 1
