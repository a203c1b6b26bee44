"""The optional operator-managed Redis that holds the prefix-cache index.

It is a cache of hints (DESIGN.md §3), so one replica without persistence is enough: losing it costs
cache misses, not wrong answers. It runs the cluster's own image unless the spec names a Redis image:
the kvferry image has `redis-server`, and a cluster that can run its nodes can run it without pulling
anything more.
"""

from __future__ import annotations

from typing import Any

from kvferry.operator.crd_model import InferenceClusterSpec
from kvferry.operator.internal_secret import REDIS_PASSWORD_KEY, internal_secret_name
from kvferry.operator.naming import ClusterRef, child_metadata, labels, selector_labels
from kvferry.operator.security import container_security_context, pod_security_context
from kvferry.redis_password import REDIS_PASSWORD_ENV

REDIS_PORT = 6379
REDIS_UID = 999  # the redis user of the official image; any non-root user does in the kvferry image
# `redis-server` by name: the kvferry image has no Redis entrypoint, and the official image's entrypoint only
# prepends the same command. No snapshots: the index is rebuilt from the nodes' KV events. The password is the
# operator's (internal_secret.py), which Kubernetes substitutes for $(...) from the container's environment.
REDIS_COMMAND = ["redis-server"]
REDIS_ARGS = ["--port", str(REDIS_PORT), "--requirepass", f"$({REDIS_PASSWORD_ENV})", "--save", "",
              "--appendonly", "no"]


def redis_password_env(ref: ClusterRef, spec: InferenceClusterSpec) -> dict[str, Any] | None:
    """The password of the cluster's Redis, for Redis itself (a managed one) and for every pod that talks to
    it: a managed Redis's from the operator's Secret, redis.url's from redis.passwordSecret; None: none."""
    if spec.redis.managed:
        secret_ref = {"name": internal_secret_name(ref), "key": REDIS_PASSWORD_KEY}
    elif spec.redis.password_secret is not None:
        secret_ref = {"name": spec.redis.password_secret.name, "key": spec.redis.password_secret.key}
    else:
        return None
    return {"name": REDIS_PASSWORD_ENV, "valueFrom": {"secretKeyRef": secret_ref}}


def redis_url(ref: ClusterRef, spec: InferenceClusterSpec) -> str | None:
    if spec.redis.managed:
        return f"redis://{ref.child_name('redis')}.{ref.namespace}.svc:{REDIS_PORT}/0"
    return spec.redis.url


def build_redis_deployment(ref: ClusterRef, spec: InferenceClusterSpec) -> dict[str, Any]:
    probe = {"tcpSocket": {"port": "redis"}}
    ready_probe = {**probe, "periodSeconds": 2}  # Redis starts in well under a second: Ready as soon as it has
    live_probe = {**probe, "periodSeconds": 10}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(ref, "redis"),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector_labels(ref, "redis")},
            "template": {
                "metadata": {"labels": labels(ref, "redis")},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security_context(REDIS_UID),
                    "containers": [
                        {
                            "name": "redis",
                            "image": spec.redis.image or spec.image,
                            "imagePullPolicy": spec.image_pull_policy,
                            "command": REDIS_COMMAND,
                            "args": REDIS_ARGS,
                            "env": [redis_password_env(ref, spec)],
                            "ports": [{"name": "redis", "containerPort": REDIS_PORT}],
                            "readinessProbe": ready_probe,
                            "livenessProbe": live_probe,
                            "securityContext": container_security_context(),
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        }
                    ],
                    "volumes": [{"name": "data", "emptyDir": {}}],
                },
            },
        },
    }


def build_redis_service(ref: ClusterRef) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(ref, "redis"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(ref, "redis"),
            "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis"}],
        },
    }
