"""The cluster configuration every pod reads, and the ConfigMap that carries it.

Pods read one document (`/etc/kvferry/cluster.json`, the contract in kvferry/cluster_config.py) instead of
a long list of flags, so prefill, decode and router agree on the model, the KV layout and the Redis index
by construction. Its hash goes on each pod template: a change to KV or transfer settings changes the
template and rolls the pods.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kvferry.cluster_config import ClusterConfig
from kvferry.operator.build_redis import redis_url
from kvferry.operator.crd_model import InferenceClusterSpec
from kvferry.operator.model_source import parse_model_source
from kvferry.operator.naming import CLUSTER_LABEL, NODE_ROLES, ROLE_LABEL, ClusterRef, child_metadata

CONFIG_DIR = "/etc/kvferry"
CONFIG_FILE = "cluster.json"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
NODE_PORT = 8000  # container port of every prefill, decode and router pod


def build_cluster_config(ref: ClusterRef, spec: InferenceClusterSpec) -> ClusterConfig:
    """What pods serve, how they lay out and move KV, and how they find each other."""
    return ClusterConfig.model_validate({
        "model": {"path": parse_model_source(spec.model.source).path, "served_name": spec.model.served_name,
                  "quantization": spec.model.quantization},
        "kv_cache": spec.kv_cache.model_dump(),
        "transfer": spec.transfer.model_dump(),
        "redis": {"url": redis_url(ref, spec)},
        "discovery": {
            "namespace": ref.namespace,
            "port": NODE_PORT,
            "selectors": {role: {CLUSTER_LABEL: ref.name, ROLE_LABEL: role} for role in NODE_ROLES},
        },
    })


def build_config_map(ref: ClusterRef, spec: InferenceClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(ref, "config"),
        "data": {CONFIG_FILE: build_cluster_config(ref, spec).to_json()},
    }


def config_hash(config_map: dict[str, Any]) -> str:
    data = json.dumps(config_map["data"], sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()[:16]
