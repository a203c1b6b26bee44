"""Deployments of the prefill, decode and router roles.

All three run the same image with `kvferry <role> --config /etc/kvferry/cluster.json` (the contract in
kvferry/cluster_config.py); the role spec adds replicas, resources and scheduling. What differs per pod
comes from the downward API: a node is named after its pod and publishes its pod IP, so replicas register
apart and the URL in a node's registry record is the one the router's Kubernetes discovery finds. The
config hash annotation on the pod template turns a change of the cluster configuration (KV cache,
transfer, Redis) into a rollout.
"""

from __future__ import annotations

from typing import Any

from kvferry.logs import FORMAT_ENV, LEVEL_ENV
from kvferry.operator.build_config import CONFIG_DIR, CONFIG_PATH, NODE_PORT
from kvferry.operator.build_rbac import router_service_account_name
from kvferry.operator.build_redis import redis_password_env
from kvferry.operator.crd_model import EnvVar, InferenceClusterSpec, RoleSpec, RouterSpec, TracingSpec
from kvferry.operator.internal_secret import TOKEN_KEY, internal_secret_name
from kvferry.operator.internal_tls import CA_CERT_KEY, CERT_KEY, KEY_KEY, server_name, serving_secret_name
from kvferry.operator.model_source import parse_model_source
from kvferry.operator.naming import (
    CONFIG_HASH_ANNOTATION,
    ClusterRef,
    ServingRole,
    child_metadata,
    labels,
    selector_labels,
)
from kvferry.operator.security import container_security_context, pod_security_context
from kvferry.redis_password import REDIS_PASSWORD_ENV
from kvferry.router.api.draining import DRAIN_PATH
from kvferry.tracing import ENDPOINT_ENV

API_KEY_ENV = "KVFERRY_API_KEY"
CLUSTER_TOKEN_ENV = "KVFERRY_CLUSTER_TOKEN"  # what kvferry.router.admission.auth.cluster_token_from reads, in every role
POD_NAME_ENV = "POD_NAME"
POD_IP_ENV = "POD_IP"
# The image's torch is PyPI's CUDA build: a node that gets a GPU uses it. Kubernetes requires a limit for
# such an extended resource (its request defaults to it), so a request alone is copied to the limit
# rather than refused by the apiserver.
GPU_RESOURCE = "nvidia.com/gpu"
# New pods a rollout starts before old ones go, per role: a quarter of it, at least one (Kubernetes rounds up).
ROLLOUT_SURGE = "25%"

# Loading weights takes minutes on a large model; the startup probe holds liveness off until then.
# Timeouts are seconds, not Kubernetes' default of one: a busy node or router answers a probe late, and
# slow is not dead. With one second, a router on a 2-core node where a decode container was being OOM-killed
# failed three liveness probes and was restarted, failing every request in flight and all that came
# until it was back (tests/pods/test_real_pods_faults.py). A dead process refuses the connection at once
# whatever the timeout, and a deleted pod leaves discovery before any probe.
# Probed every 2 s: a pod that has started serves within 2 s (a scale-out is that much sooner; at 10 s the
# probes alone added about 7 s to each pod's start), and the budgets stay 600 s to start, 10 s to turn unready.
_STARTUP_PROBE = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 2, "failureThreshold": 300,
                  "timeoutSeconds": 5}
_LIVENESS_PROBE = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10, "failureThreshold": 3,
                   "timeoutSeconds": 10}
_READINESS_PROBE = {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 2, "failureThreshold": 5,
                    "timeoutSeconds": 5}


def _downward_env() -> dict[str, dict[str, Any]]:
    # A node's name in the registry and the address it publishes: its args refer to these as $(POD_NAME)
    # and $(POD_IP), which the kubelet expands.
    fields = {POD_NAME_ENV: "metadata.name", POD_IP_ENV: "status.podIP"}
    return {name: {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}} for name, path in fields.items()}


TLS_DIR = "/etc/kvferry/tls"  # the router's certificate and key, from spec.router.tlsSecret
# From spec.internalTls's Secret: the nodes' certificate and key on the nodes, the CA bundle on the routers.
INTERNAL_TLS_DIR = "/etc/kvferry/internal-tls"
PRE_STOP_SECONDS = 3
CLOSE_SECONDS = 10


def _pre_stop_seconds(role: ServingRole, drain_seconds: int) -> int:
    """The longest a pod's preStop hook takes: a router's waits on for the streams begun before it."""
    return PRE_STOP_SECONDS + drain_seconds if role == "router" else PRE_STOP_SECONDS


def _pre_stop(role: ServingRole, drain_seconds: int, scheme: str) -> dict[str, Any]:
    """Deleted, a pod at once stops being an endpoint (routers' discovery, kube-proxy), but those lag a little:
    it keeps taking what reaches it until SIGTERM comes after this wait. The router's clients hold keep-alive
    connections to it, so it spends the wait answering each with `Connection: close`, and waits on, within its
    drain, for the streams begun before it to end: their clients would reuse the connection (draining.py)."""
    if role == "router":
        longest = _pre_stop_seconds(role, drain_seconds)
        return _over(scheme, {"httpGet": {"path": f"{DRAIN_PATH}?seconds={PRE_STOP_SECONDS}&longest={longest}",
                                          "port": NODE_PORT}})
    return {"sleep": {"seconds": PRE_STOP_SECONDS}}


def _args(ref: ClusterRef, spec: InferenceClusterSpec, role: ServingRole) -> list[str]:
    role_spec = spec.role(role)
    args = [role, "--config", CONFIG_PATH, "--host", "0.0.0.0", "--port", str(NODE_PORT),
            "--shutdown-grace", str(role_spec.drain_seconds)]
    if role != "router":
        args += ["--name", f"$({POD_NAME_ENV})", "--advertise-host", f"$({POD_IP_ENV})"]
    if _tls_secret(role_spec) is not None:
        args += ["--tls-cert-file", f"{TLS_DIR}/tls.crt", "--tls-key-file", f"{TLS_DIR}/tls.key"]
    if (internal := spec.internal_tls) is not None:
        if role == "router":
            args += ["--internal-ca-file", f"{INTERNAL_TLS_DIR}/{CA_CERT_KEY}",
                     "--internal-server-name", server_name(ref, internal)]
        else:
            args += ["--tls-cert-file", f"{INTERNAL_TLS_DIR}/{CERT_KEY}", "--tls-key-file", f"{INTERNAL_TLS_DIR}/{KEY_KEY}"]
    return args


def _scheme(spec: InferenceClusterSpec, role: ServingRole) -> str:
    """How the kubelet's probes reach the role's pods: HTTPS where they serve it (spec.router.tlsSecret on
    the router, spec.internalTls on the nodes)."""
    tls = _tls_secret(spec.router) is not None if role == "router" else spec.internal_tls is not None
    return "HTTPS" if tls else "HTTP"


def _tls_secret(role_spec: RoleSpec) -> str | None:
    """The router's TLS Secret: it then serves HTTPS only, and its probes and drain hook speak HTTPS."""
    return role_spec.tls_secret if isinstance(role_spec, RouterSpec) else None


def _over(scheme: str, probe: dict[str, Any]) -> dict[str, Any]:
    """A probe or hook whose httpGet goes over `scheme` (the kubelet does not check the certificate). HTTP is
    Kubernetes' default and left unsaid: pods of a cluster without TLS keep their template across upgrades."""
    return probe if scheme == "HTTP" else {**probe, "httpGet": {**probe["httpGet"], "scheme": scheme}}


def _container_env(
    ref: ClusterRef, spec: InferenceClusterSpec, role: ServingRole, role_spec: RoleSpec
) -> list[dict[str, Any]]:
    env = _downward_env() if role != "router" else {}
    if spec.auth_secret is not None and role == "router":
        secret_ref = {"name": spec.auth_secret.name, "key": spec.auth_secret.key}
        env[API_KEY_ENV] = {"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": secret_ref}}
    # Nodes require the token, the router sends it; the user's Secret, else the one the operator made.
    token_ref = ({"name": spec.cluster_token_secret.name, "key": spec.cluster_token_secret.key}
                 if spec.cluster_token_secret is not None else {"name": internal_secret_name(ref), "key": TOKEN_KEY})
    env[CLUSTER_TOKEN_ENV] = {"name": CLUSTER_TOKEN_ENV, "valueFrom": {"secretKeyRef": token_ref}}
    if (password := redis_password_env(ref, spec)) is not None:
        env[REDIS_PASSWORD_ENV] = password
    env[LEVEL_ENV] = {"name": LEVEL_ENV, "value": spec.logging.level}
    env[FORMAT_ENV] = {"name": FORMAT_ENV, "value": spec.logging.format}
    env.update(_tracing_env(spec.tracing))
    # The user's variables win over ours by name; server-side apply rejects a list with duplicate names.
    env.update({var.name: _env_var(var) for var in role_spec.env})
    return list(env.values())


def _tracing_env(tracing: TracingSpec) -> dict[str, dict[str, str]]:
    """The OpenTelemetry SDK's own variables (kvferry/tracing.py reads the endpoint; the SDK the sampler): the
    routers sample, a node follows the decision its call carries."""
    if tracing.otlp_endpoint is None:
        return {}
    values = {ENDPOINT_ENV: tracing.otlp_endpoint, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
              "OTEL_TRACES_SAMPLER_ARG": str(tracing.sample_ratio)}
    return {name: {"name": name, "value": value} for name, value in values.items()}


def _env_var(var: EnvVar) -> dict[str, Any]:
    return var.model_dump(by_alias=True, exclude_none=True)


def _resources(role_spec: RoleSpec) -> dict[str, Any]:
    resources = role_spec.resources.model_dump(by_alias=True, exclude_defaults=True)
    requests = resources.get("requests", {})
    limits = {GPU_RESOURCE: requests[GPU_RESOURCE]} if GPU_RESOURCE in requests else {}
    limits |= resources.get("limits", {})
    return {**resources, "limits": limits} if limits else resources


def _volumes(spec: InferenceClusterSpec, role: ServingRole, ref: ClusterRef) -> tuple[list[dict], list[dict]]:
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": ref.child_name("config")}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if (tls := _tls_secret(spec.role(role))) is not None:
        volumes.append({"name": "tls", "secret": {"secretName": tls}})
        mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
    if spec.internal_tls is not None:
        # Each pod gets what it uses: a router has no use for the nodes' private key.
        keys = [CA_CERT_KEY] if role == "router" else [CERT_KEY, KEY_KEY]
        secret = {"secretName": serving_secret_name(ref, spec.internal_tls), "items": [{"key": k, "path": k} for k in keys]}
        volumes.append({"name": "internal-tls", "secret": secret})
        mounts.append({"name": "internal-tls", "mountPath": INTERNAL_TLS_DIR, "readOnly": True})
    if role != "router":
        # UCX's shared-memory transports need a /dev/shm larger than the runtime's 64 MiB default.
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    model = parse_model_source(spec.model.source)
    if model.volume is not None:
        volumes.append(model.volume)
        mounts.append(model.volume_mount())
    return volumes, mounts


def _spread(ref: ClusterRef, role: ServingRole) -> list[dict[str, Any]]:
    """A role's pods over nodes, then zones, where the scheduler can (never left Pending for it): losing a
    node or a zone takes few of them. pod-template-hash: a rollout's new pods spread among themselves."""
    return [
        {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
         "labelSelector": {"matchLabels": selector_labels(ref, role)}, "matchLabelKeys": ["pod-template-hash"]}
        for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")
    ]


def _scheduling(ref: ClusterRef, role: ServingRole, role_spec: RoleSpec) -> dict[str, Any]:
    chosen = role_spec.topology_spread_constraints
    spread = _spread(ref, role) if chosen is None else list(chosen)
    scheduling: dict[str, Any] = {"topologySpreadConstraints": spread} if spread else {}
    if role_spec.node_selector:
        scheduling["nodeSelector"] = dict(role_spec.node_selector)
    if role_spec.tolerations:
        scheduling["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in role_spec.tolerations
        ]
    if role_spec.affinity is not None:
        scheduling["affinity"] = role_spec.affinity
    return scheduling


def build_role_deployment(
    ref: ClusterRef, spec: InferenceClusterSpec, role: ServingRole, config_hash: str, replicas: int | None
) -> dict[str, Any]:
    """`replicas`: the role's count (replica_counts.py: the spec's, or the autoscaling planner's); None
    leaves it out, so that server-side apply neither sets nor resets what another controller scaled."""
    role_spec = spec.role(role)
    drain = role_spec.drain_seconds
    scheme = _scheme(spec, role)
    volumes, mounts = _volumes(spec, role, ref)
    container = {
        "name": role,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["kvferry"],
        "args": _args(ref, spec, role),
        "ports": [{"name": "http", "containerPort": NODE_PORT, "protocol": "TCP"}],
        "env": _container_env(ref, spec, role, role_spec),
        "resources": _resources(role_spec),
        "startupProbe": _over(scheme, _STARTUP_PROBE),
        "livenessProbe": _over(scheme, _LIVENESS_PROBE),
        "readinessProbe": _over(scheme, _READINESS_PROBE),
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
        "lifecycle": {"preStop": _pre_stop(role, drain, scheme)},
    }
    pod_spec: dict[str, Any] = {
        # The preStop hook, the drain (--shutdown-grace), then the process's own close (engine, transfers).
        "terminationGracePeriodSeconds": _pre_stop_seconds(role, drain) + drain + CLOSE_SECONDS,
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": volumes,
        **_scheduling(ref, role, role_spec),
    }
    if role == "router":
        pod_spec["serviceAccountName"] = router_service_account_name(ref)
    else:
        pod_spec["automountServiceAccountToken"] = False  # nodes never talk to the Kubernetes API
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(ref, role),
        "spec": {
            **({} if replicas is None else {"replicas": replicas}),
            # Capacity never dips in a rollout: an old pod goes only once its replacement is ready, so a
            # replacement that never gets ready stops the rollout with the old pods serving.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": ROLLOUT_SURGE, "maxUnavailable": 0}},
            "progressDeadlineSeconds": spec.rollout_deadline_seconds,
            "selector": {"matchLabels": selector_labels(ref, role)},
            "template": {
                "metadata": {
                    "labels": labels(ref, role),
                    "annotations": {CONFIG_HASH_ANNOTATION: config_hash},
                },
                "spec": pod_spec,
            },
        },
    }
