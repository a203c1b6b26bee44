"""Discovery from the Kubernetes API: the pods that match each role's label selector (as the operator
labels them: `kvferry.dev/cluster`, `kvferry.dev/role`), watched. A pod counts once it is Running and
Ready with an IP, and stops counting when it is not Ready or is being deleted.

The kubernetes client is synchronous: each role's list-then-watch loop runs in a thread of its own,
and `endpoints()` reads what the threads keep up to date.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from kvferry.operator.naming import ROLE_LABEL
from kvferry.router.config import DiscoverySection
from kvferry.router.nodes import Endpoint, Role

from kvferry.node_config import node_url

log = logging.getLogger(__name__)
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
WATCH_SECONDS = 30  # a watch is re-opened this often, so a stop is noticed and a lost one recovers
RETRY_SECONDS = 1.0


def pod_is_serving(pod: Any) -> bool:
    status = pod.status
    if pod.metadata.deletion_timestamp is not None or status is None or status.phase != "Running" or not status.pod_ip:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in status.conditions or [])


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


class KubernetesDiscovery:
    def __init__(self, api: Any, namespace: str, selectors: dict[Role, dict[str, str]], port: int) -> None:
        self.api, self.namespace, self.selectors, self.port = api, namespace, selectors, port
        self._pods: dict[Role, dict[str, str]] = {role: {} for role in selectors}  # role -> pod name -> URL
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    @classmethod
    def from_config(cls, settings: DiscoverySection) -> KubernetesDiscovery:
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
        return cls(client.CoreV1Api(api_client), namespace, dict(selectors), settings.port)

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

    def _apply(self, role: Role, pod: Any) -> None:
        with self._lock:
            if pod_is_serving(pod):
                self._pods[role][pod.metadata.name] = node_url(pod.status.pod_ip, self.port)
            else:
                self._pods[role].pop(pod.metadata.name, None)

    def _watch_role(self, role: Role) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        selector = label_selector(self.selectors[role])
        while not self._stopping.is_set():
            try:
                listed = self.api.list_namespaced_pod(self.namespace, label_selector=selector)
                with self._lock:
                    self._pods[role] = {}
                for pod in listed.items:
                    self._apply(role, pod)
                version = listed.metadata.resource_version
                while not self._stopping.is_set():
                    stream = watch.Watch().stream(
                        self.api.list_namespaced_pod, self.namespace, label_selector=selector,
                        resource_version=version, timeout_seconds=WATCH_SECONDS, allow_watch_bookmarks=True,
                    )
                    for event in stream:
                        pod = event["object"]
                        version = pod.metadata.resource_version
                        if event["type"] == "DELETED":
                            with self._lock:
                                self._pods[role].pop(pod.metadata.name, None)
                        elif event["type"] in ("ADDED", "MODIFIED"):
                            self._apply(role, pod)
                        if self._stopping.is_set():
                            return
            except ApiException as exc:  # 410 Gone (an old resource version) and the rest: list again
                log.warning("watching %s pods (%s) failed: %s; listing again", role, selector, exc.reason)
            except Exception as exc:  # noqa: BLE001 - the API server restarting must not end discovery
                log.warning("watching %s pods (%s) failed: %r; listing again", role, selector, exc)
            self._stopping.wait(RETRY_SECONDS)
