"""A small JSON client for the handful of Kubernetes kinds the operator touches.

Built on the `kubernetes` package's transport (TLS, tokens, exec plugins) but addressing objects by an
explicit path table, so no discovery round-trips happen and apply is real server-side apply.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException

from kvferry.operator.naming import FIELD_MANAGER, KIND, PLURAL

JSON = "application/json"
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is valid YAML, so the body goes as JSON
MERGE_PATCH = "application/merge-patch+json"

PLURALS: dict[str, str] = {
    "ConfigMap": "configmaps",
    "Service": "services",
    "ServiceAccount": "serviceaccounts",
    "Deployment": "deployments",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Lease": "leases",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "Pod": "pods",  # the autoscaler's scrape targets (read only)
    "Event": "events",  # the autoscaler's decisions
    "Secret": "secrets",  # the cluster's own token and Redis password (internal_secret.py), made once
    KIND: PLURAL,
}


def collection_path(api_version: str, kind: str, namespace: str | None) -> str:
    """None: the collection across every namespace (list only)."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"{prefix}{scope}/{PLURALS[kind]}"


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    return f"{collection_path(api_version, kind, namespace)}/{name}"


def manifest_path(manifest: Mapping[str, Any]) -> str:
    meta = manifest["metadata"]
    return object_path(manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])


class Kube:
    def __init__(self, configuration: Configuration) -> None:
        self._api = ApiClient(configuration)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Iterable[tuple[str, str]] = (),
        content_type: str = JSON,
    ) -> dict[str, Any]:
        serialized = self._api.param_serialize(
            method,
            path,
            query_params=list(query),
            header_params={"Accept": JSON, "Content-Type": content_type},
            body=body,  # the transport JSON-encodes dicts for JSON and +yaml content types alike
            auth_settings=["BearerToken"],
        )
        response = self._api.call_api(*serialized)
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(
                http_resp=response, body=data.decode(errors="replace"), data=None
            )
        return json.loads(data) if data else {}

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", object_path(api_version, kind, namespace, name))
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def list(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str
    ) -> list[dict[str, Any]]:
        path = collection_path(api_version, kind, namespace)
        return self.request("GET", path, query=[("labelSelector", label_selector)]).get("items", [])

    def apply(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        # force: the operator owns these fields; another manager's edits are overwritten, not a conflict.
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        return self.request(
            "PATCH", manifest_path(manifest), body=manifest, query=query, content_type=APPLY_PATCH
        )

    def create(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        meta = manifest["metadata"]
        path = collection_path(manifest["apiVersion"], manifest["kind"], meta["namespace"])
        return self.request("POST", path, body=manifest)

    def replace(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("PUT", manifest_path(manifest), body=manifest)

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        try:
            self.request("DELETE", object_path(api_version, kind, namespace, name))
        except ApiException as error:
            if error.status != 404:
                raise

    def patch_status(self, api_version: str, kind: str, namespace: str, name: str, patch: Mapping) -> None:
        path = object_path(api_version, kind, namespace, name) + "/status"
        self.request("PATCH", path, body=patch, content_type=MERGE_PATCH)
