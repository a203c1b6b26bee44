"""The cluster configuration every pod reads, and the ConfigMap that carries it.

Pods read one JSON document (`/etc/kvferry/cluster.json`) instead of a long list of flags, so prefill,
decode and router agree on the KV layout and the Redis index by construction. Its hash goes on each pod
template: a change to KV or transfer settings changes the template and rolls the pods.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kvferry.operator.build_redis import redis_url
from kvferry.operator.crd_model import InferenceClusterSpec
from kvferry.operator.model_source import parse_model_source
from kvferry.operator.naming import CLUSTER_LABEL, ROLE_LABEL, ClusterRef, child_metadata

CONFIG_DIR = "/etc/kvferry"
CONFIG_FILE = "cluster.json"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
NODE_PORT = 8000  # container port of every prefill, decode and router pod


def build_cluster_config(ref: ClusterRef, spec: InferenceClusterSpec) -> dict[str, Any]:
    """The document pods read: what they serve, how they lay out and move KV, and how they find each other."""
    return {
        "cluster": ref.name,
        "namespace": ref.namespace,
        "model": {"path": parse_model_source(spec.model.source).path, "servedName": spec.model.served_name},
        "kvCache": spec.kv_cache.model_dump(by_alias=True),
        "transfer": spec.transfer.model_dump(by_alias=True, mode="json"),
        "redis": {"url": redis_url(ref, spec)},
        "discovery": {
            "mode": "kubernetes",
            "namespace": ref.namespace,
            "port": NODE_PORT,
            "selectors": {
                role: {CLUSTER_LABEL: ref.name, ROLE_LABEL: role} for role in ("prefill", "decode")
            },
        },
    }


def build_config_map(ref: ClusterRef, spec: InferenceClusterSpec) -> dict[str, Any]:
    document = json.dumps(build_cluster_config(ref, spec), indent=2, sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(ref, "config"),
        "data": {CONFIG_FILE: document + "\n"},
    }


def config_hash(config_map: dict[str, Any]) -> str:
    data = json.dumps(config_map["data"], sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()[:16]
