"""The InferenceCluster resource as pydantic models: the one source of the CRD schema and of validation.

`crd.py` turns these models into the CRD's structural openAPIV3Schema (descriptions, defaults, enums,
bounds), and the operator validates every spec it reconciles with the same models. Field descriptions
are what `kubectl explain inferencecluster.spec...` prints, so they are written for users.
Checks that a schema cannot express (whether a model source can work) live in field validators here,
so the operator applies them and reports a Degraded condition when they fail.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from kvferry import __version__
from kvferry.logs import LogFormat, LogLevel
from kvferry.operator.model_source import SUPPORTED_FORMS, parse_model_source
from kvferry.operator.naming import ServingRole
from kvferry.operator.planner.plan import ScalingPolicy

# What `make image` builds and imports into the node's container runtime: no registry needs to be reachable.
DEFAULT_IMAGE = f"localhost/kvferry:{__version__}"
DEFAULT_ROUTER_PORT = 8000
MAX_REPLICAS = 1024

# Kubernetes' own resource.Quantity pattern (k8s.io/apimachinery), so a bad quantity such as "lots" is
# rejected at apply time instead of failing later when the operator applies the Deployment.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
Quantity = Annotated[
    int | Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN)],
    WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}),
]
EnvName = Annotated[str, StringConstraints(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")]
DnsSubdomain = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
]
UcxTransport = Annotated[str, StringConstraints(pattern=r"^\^?[a-z0-9_]+$")]


class KubeModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


def nested(model: type[KubeModel], description: str) -> Any:
    # `default: {}` in the schema makes the apiserver fill in the nested fields' own defaults when the
    # user leaves the whole object out, which is what pydantic does with default_factory.
    return Field(default_factory=model, description=description, json_schema_extra={"default": {}})


class ModelSpec(KubeModel):
    source: str = Field(
        min_length=1,
        description=f"Where the model's Hugging Face folder is: {SUPPORTED_FORMS}. "
        "A PVC or host folder is mounted read-only at /models.",
    )
    served_name: str = Field(
        min_length=1,
        max_length=256,
        description="Model name that clients send in the `model` field of OpenAI-style requests.",
    )
    quantization: Literal["fp8", "int8", "int4"] | None = Field(
        None,
        description="fp8: prefill and decode nodes keep the linear layers in FP8 e4m3 with per-channel scales, "
        "quantized at load (an FP8 checkpoint is served as FP8 without it). int8 (CPU nodes only): the linear "
        "layers and the LM head in int8 with per-channel scales. int4 (CPU nodes only): the linear layers in 4 "
        "bits with a scale and a zero per 32 weights, multiplied in bfloat16 (fastest with kvCache.dtype bfloat16).",
    )

    @field_validator("source")
    @classmethod
    def _source_can_work(cls, source: str) -> str:
        parse_model_source(source)
        return source


class ResourceRequirements(KubeModel):
    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        description="Minimum resources per pod, e.g. {cpu: 4, memory: 32Gi, nvidia.com/gpu: 1}.",
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, description="Maximum resources per pod, same keys as requests."
    )


class EnvVar(KubeModel):
    name: EnvName = Field(description="Environment variable name.")
    value: str | None = Field(None, description="Literal value.")
    value_from: dict[str, Any] | None = Field(
        None, description="A Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, ...)."
    )


class Toleration(KubeModel):
    key: str | None = Field(
        None, description="Taint key to tolerate; empty with Exists tolerates every taint."
    )
    operator: Literal["Exists", "Equal"] | None = Field(None, description="How key and value are compared.")
    value: str | None = Field(None, description="Taint value to match with the Equal operator.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        None, ge=0, description="How long a NoExecute taint is tolerated before eviction."
    )


class RoleSpec(KubeModel):
    replicas: int = Field(1, ge=0, le=MAX_REPLICAS, description="Number of pods of this role.")
    scale_externally: bool = Field(
        False,
        description="Leave this role's pod count to another controller (an HPA or KEDA scaling the role's "
        "Deployment through its /scale subresource): the operator leaves the Deployment's replicas out of what "
        "it applies, so it neither sets nor resets them, and replicas is not used.",
    )
    resources: ResourceRequirements = nested(
        ResourceRequirements, "CPU, memory and accelerator requests and limits per pod."
    )
    env: tuple[EnvVar, ...] = Field(
        (),
        description="Extra environment variables; a name set by the operator is overridden.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the pods must be scheduled on."
    )
    tolerations: tuple[Toleration, ...] = Field((), description="Taints the pods tolerate.")
    affinity: dict[str, Any] | None = Field(
        None,
        description="A Kubernetes Affinity (nodeAffinity, podAffinity, podAntiAffinity), passed to pods.",
    )
    drain_seconds: int = Field(
        30,
        ge=0,
        le=3600,
        description="A pod told to stop (deleted, scaled down, evicted by a drain, replaced by a rollout) leaves "
        "the routers' choice at once, then finishes its requests for up to this long before what is left is cut "
        "(a decode stream cut so is resumed on another decode pod). Sets the pod's "
        "terminationGracePeriodSeconds.",
    )
    topology_spread_constraints: tuple[dict[str, Any], ...] | None = Field(
        None,
        description="Kubernetes TopologySpreadConstraints for the pods. Unset: the role's pods spread over "
        "nodes and zones where they can (maxSkew 1, ScheduleAnyway), so one node's loss takes few of them; "
        "[] turns spreading off.",
    )

    @field_validator("env")
    @classmethod
    def _env_names_unique(cls, env: tuple[EnvVar, ...]) -> tuple[EnvVar, ...]:
        names = [var.name for var in env]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"duplicate environment variable names: {', '.join(duplicates)}")
        return env


class Autoscaling(KubeModel):
    """What prefill's and decode's autoscaling share: bounds and the pace of changes."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self.minReplicas <= self.maxReplicas", "message": "minReplicas must not exceed maxReplicas"}
            ]
        }
    )

    min_replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="The fewest pods the planner keeps.")
    max_replicas: int = Field(ge=1, le=MAX_REPLICAS, description="The most pods the planner asks for.")
    scale_up_cooldown_seconds: int = Field(
        60, ge=0, le=3600, description="Time after a change before the planner adds pods again."
    )
    scale_down_window_seconds: int = Field(
        300,
        ge=0,
        le=86400,
        description="The planner removes pods only when every recommendation of this long window asked for "
        "fewer, and not sooner than this after a change.",
    )

    @model_validator(mode="after")
    def _bounds_in_order(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError("minReplicas must not exceed maxReplicas")
        return self


class PrefillAutoscaling(Autoscaling):
    ttft_p90_seconds: float = Field(
        gt=0, le=3600, description="Target: the 90th percentile of time to first token, as the routers measure it."
    )

    def policy(self) -> ScalingPolicy:
        return ScalingPolicy(self.min_replicas, self.max_replicas, self.ttft_p90_seconds, "queueing",
                             scale_up_cooldown_s=self.scale_up_cooldown_seconds,
                             scale_down_window_s=self.scale_down_window_seconds)


class DecodeAutoscaling(Autoscaling):
    itl_p90_seconds: float = Field(
        gt=0, le=60, description="Target: the 90th percentile of the gap between a stream's tokens, as the routers "
        "measure it."
    )
    kv_cache_usage: float = Field(
        0.9, gt=0, le=1, description="Target: the fraction of the decode nodes' KV blocks in use, on average."
    )

    def policy(self) -> ScalingPolicy:
        return ScalingPolicy(self.min_replicas, self.max_replicas, self.itl_p90_seconds, "batching",
                             kv_usage_target=self.kv_cache_usage,
                             scale_up_cooldown_s=self.scale_up_cooldown_seconds,
                             scale_down_window_s=self.scale_down_window_seconds)


AUTOSCALED = "With autoscaling, the planner sets the count between its bounds (replicas is the start)."
ONE_SCALER = "autoscaling and scaleExternally both set the pod count: choose one"


class AutoscaledRoleSpec(RoleSpec):
    """A role the operator's planner can scale: its count has one owner, the planner or another controller."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "!(has(self.autoscaling) && has(self.scaleExternally) && self.scaleExternally)",
                 "message": ONE_SCALER}
            ]
        }
    )

    autoscaling: Autoscaling | None = None  # each role's own kind of it, below

    @model_validator(mode="after")
    def _one_scaler(self) -> AutoscaledRoleSpec:
        if self.autoscaling is not None and self.scale_externally:
            raise ValueError(ONE_SCALER)
        return self


class PrefillSpec(AutoscaledRoleSpec):
    autoscaling: PrefillAutoscaling | None = Field(
        None, description=f"Scale prefill pods to a TTFT target. {AUTOSCALED}"
    )


class DecodeSpec(AutoscaledRoleSpec):
    autoscaling: DecodeAutoscaling | None = Field(
        None, description=f"Scale decode pods to inter-token latency and KV usage targets. {AUTOSCALED}"
    )


class RouterSpec(RoleSpec):
    replicas: int = Field(
        2, ge=0, le=MAX_REPLICAS,
        description="Number of router pods: two by default, so that losing or replacing one leaves another "
        "serving (what an answer depends on is shared through Redis; without Redis, a Responses API "
        "previous_response_id is found only on the router that stored it).",
    )
    service_type: Literal["ClusterIP", "LoadBalancer"] = Field(
        "ClusterIP",
        description="Type of the router's Service: ClusterIP inside the cluster, or LoadBalancer.",
    )
    port: int = Field(
        DEFAULT_ROUTER_PORT, ge=1, le=65535, description="Port the router's Service listens on."
    )
    tls_secret: DnsSubdomain | None = Field(
        None,
        description="Name of a kubernetes.io/tls Secret (tls.crt, tls.key) in the cluster's namespace: the router "
        "then serves HTTPS only, with that certificate; unset, plain HTTP.",
    )


class KVCacheSpec(KubeModel):
    block_size: Literal[8, 16, 32, 64, 128] = Field(16, description="Tokens per KV cache block.")
    memory_fraction: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Fraction of the GPU's memory a node may use, weights and activations included "
        "(on a CPU the KV pool is 1 GiB).",
    )
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        "auto",
        description="Element type of the KV cache, which is also the type nodes compute in; "
        "auto: the checkpoint's type on a GPU, float32 on a CPU.",
    )


class TransferSpec(KubeModel):
    protocol: Literal["ucx"] = Field(
        "ucx",
        description="How prefill nodes send KV blocks to decode nodes: UCX, which picks shared memory, "
        "CMA, TCP, RDMA or CUDA IPC by itself.",
    )
    ucx_transports: tuple[UcxTransport, ...] = Field(
        (),
        description="UCX transports (UCX_TLS), e.g. [rc, cuda_ipc, sm]; empty lets UCX choose.",
    )


class RedisPasswordSecretRef(KubeModel):
    name: DnsSubdomain = Field(description="Name of a Secret in the cluster's namespace.")
    key: str = Field("password", min_length=1, description="Key in the Secret that holds the password.")


class RedisSpec(KubeModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!(has(self.url) && self.managed)",
                    "message": "set redis.url or redis.managed, not both",
                },
                {
                    "rule": "!has(self.passwordSecret) || has(self.url)",
                    "message": "redis.passwordSecret is the password of redis.url's Redis (a managed one has its own)",
                },
            ]
        }
    )

    url: Annotated[str, StringConstraints(pattern=r"^rediss?://.+")] | None = Field(
        None, description="URL of an existing Redis for the prefix-cache index, e.g. redis://redis:6379/0."
    )
    managed: bool = Field(False, description="Let the operator run a Redis Deployment and Service.")
    image: str | None = Field(
        None,
        min_length=1,
        description="Image of the managed Redis, run as `redis-server`; empty: the cluster's own image, "
        "which has it (nothing to pull from a registry).",
    )

    password_secret: RedisPasswordSecretRef | None = Field(
        None, description="Secret holding the password of redis.url's Redis (the chart's shared one has one); "
        "every pod gets it as KVFERRY_REDIS_PASSWORD, never in a ConfigMap.")

    @model_validator(mode="after")
    def _one_redis(self) -> RedisSpec:
        if self.url is not None and self.managed:
            raise ValueError("set redis.url or redis.managed, not both")
        if self.password_secret is not None and self.url is None:
            raise ValueError("redis.passwordSecret is the password of redis.url's Redis (a managed one has its own)")
        return self


class SecretKeyRef(KubeModel):
    name: DnsSubdomain = Field(description="Name of a Secret in the cluster's namespace.")
    key: str = Field("api-key", min_length=1, description="Key in the Secret that holds the API key.")


class ClusterTokenSecretRef(KubeModel):
    name: DnsSubdomain = Field(description="Name of a Secret in the cluster's namespace.")
    key: str = Field("cluster-token", min_length=1, description="Key in the Secret that holds the token.")


class LoggingSpec(KubeModel):
    level: LogLevel = Field("warning", description="Lowest level logged; info adds a line per request (the "
                            "router's with its tokens and timings, each node's) under the request's X-Request-Id.")
    format: LogFormat = Field("text", description="text, or json: one object a line, for a log pipeline.")


class TracingSpec(KubeModel):
    otlp_endpoint: str | None = Field(
        None, min_length=1, pattern=r"^https?://",
        description="OTLP/HTTP traces URL (e.g. http://otel-collector.observability:4318/v1/traces): every pod "
        "exports its spans there, one trace per request across router, prefill and decode. None: tracing off.")
    sample_ratio: float = Field(1.0, ge=0, le=1, description="The share of requests the routers trace; the nodes "
                                "follow the router's decision (a client's sampled traceparent is followed too).")


class InternalTLSSpec(KubeModel):
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(self.mode == 'secret') == has(self.secretName)",
                    "message": "internalTls.secretName goes with mode secret, and only with it",
                },
            ]
        }
    )

    mode: Literal["selfSigned", "secret"] = Field(
        description="selfSigned: the operator makes a CA for this cluster (Secret <name>-internal-ca) and "
        "issues the nodes' certificate from it (Secret <name>-internal-tls), again before a third of its "
        "lifetime is left; secret: the nodes' certificate comes from secretName."
    )
    secret_name: DnsSubdomain | None = Field(
        None,
        description="mode secret: a Secret in the cluster's namespace with tls.crt and tls.key (the nodes' "
        "certificate, valid for serverName) and ca.crt (the CA bundle the router trusts), as cert-manager "
        "writes them. Pods take a rotated one without a restart.",
    )
    server_name: DnsSubdomain | None = Field(
        None,
        description="The name the nodes' certificate carries, which the router checks while it dials pod IPs; "
        "default <name>-nodes.<namespace>.svc.",
    )

    @model_validator(mode="after")
    def _secret_with_its_mode(self) -> InternalTLSSpec:
        if (self.mode == "secret") != (self.secret_name is not None):
            raise ValueError("internalTls.secretName goes with mode secret, and only with it")
        return self


class InferenceClusterSpec(KubeModel):
    model: ModelSpec = Field(description="The model every node serves.")
    image: str = Field(
        DEFAULT_IMAGE, min_length=1, description="Container image of prefill, decode and router."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="When the kubelet pulls the image."
    )
    prefill: PrefillSpec = nested(
        PrefillSpec, "Prefill nodes: compute prompts' KV cache and send it to decode nodes."
    )
    decode: DecodeSpec = nested(DecodeSpec, "Decode nodes: receive KV blocks and stream generated tokens.")
    router: RouterSpec = nested(RouterSpec, "Router: the OpenAI-compatible endpoint that picks the nodes.")
    kv_cache: KVCacheSpec = nested(KVCacheSpec, "KV cache pool of every node.")
    transfer: TransferSpec = nested(TransferSpec, "KV block transfer from prefill to decode nodes.")
    redis: RedisSpec = nested(
        RedisSpec,
        "Redis for the shared prefix-cache index and the node registry; with neither url nor managed, "
        "routing has no index and KV blocks cannot move between pods (decode nodes prefill locally).",
    )
    rollout_deadline_seconds: int = Field(
        600,
        ge=30,
        le=86400,
        description="A change of the model, image or KV settings replaces pods one at a time, each old pod "
        "kept until its replacement is ready, and the router pairs prefill and decode pods of the same model "
        "only. A role whose new pods are not ready this long after the last progress has failed: the rollout "
        "stops with the old pods serving, and status says Degraded with the reason.",
    )
    logging: LoggingSpec = nested(LoggingSpec, "How the prefill, decode and router pods log (docs/kubernetes.md).")
    tracing: TracingSpec = nested(TracingSpec, "OpenTelemetry traces of the requests (docs/router.md, tracing).")
    auth_secret: SecretKeyRef | None = Field(
        None, description="Secret holding the API key clients must send; without it the router is open."
    )
    cluster_token_secret: ClusterTokenSecretRef | None = Field(
        None,
        description=(
            "Secret holding the token the router sends to prefill and decode nodes, which refuse internal "
            "calls and KV transfers without it; without it the operator makes one (Secret <name>-internal)."
        ),
    )
    internal_tls: InternalTLSSpec | None = Field(
        None,
        description="HTTPS between the router and the nodes: the nodes serve HTTPS only and the router trusts "
        "their CA alone (docs/kubernetes.md); unset, plain HTTP inside the cluster.",
    )

    def role(self, role: ServingRole) -> RoleSpec:
        """The spec of one serving role, by its name."""
        return {"prefill": self.prefill, "decode": self.decode, "router": self.router}[role]


class RoleStatus(KubeModel):
    desired: int = Field(0, description="Replicas the spec asks for.")
    ready: int = Field(0, description="Replicas whose pods are Ready.")
    updated: int = Field(0, description="Replicas running the current pod template.")


class Condition(KubeModel):
    type: Literal["Ready", "Progressing", "Degraded"] = Field(description="Condition type.")
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: str = Field(description="CamelCase reason for the last transition.")
    message: str = Field("", description="Human-readable details.")
    last_transition_time: str = Field(
        description="When status last changed.", json_schema_extra={"format": "date-time"}
    )
    observed_generation: int = Field(0, description="metadata.generation the condition was computed for.")


class AutoscaledRole(KubeModel):
    replicas: int = Field(description="Pods the planner decided on.")
    recommended: int = Field(description="Pods the last interval alone asked for, before cool-downs and windows.")
    reason: str = Field(description="The last decision and what it was made on.")
    last_scale_time: str | None = Field(
        None, description="When the planner last changed the count.", json_schema_extra={"format": "date-time"}
    )


class AutoscalingStatus(KubeModel):
    prefill: AutoscaledRole | None = Field(None, description="The planner's prefill decisions.")
    decode: AutoscaledRole | None = Field(None, description="The planner's decode decisions.")


class InferenceClusterStatus(KubeModel):
    phase: Literal["Pending", "Progressing", "Ready", "Degraded"] = Field(
        "Pending", description="Summary: Pending, Progressing (rolling out), Ready or Degraded."
    )
    conditions: tuple[Condition, ...] = Field(
        (),
        description="Ready, Progressing and Degraded conditions with reasons.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    prefill: RoleStatus = nested(RoleStatus, "Prefill replicas.")
    decode: RoleStatus = nested(RoleStatus, "Decode replicas.")
    router: RoleStatus = nested(RoleStatus, "Router replicas.")
    observed_generation: int = Field(0, description="metadata.generation the operator last reconciled.")
    router_endpoint: str | None = Field(None, description="URL of the router's OpenAI-compatible API.")
    autoscaling: AutoscalingStatus | None = Field(
        None, description="The autoscaling planner's decisions, for the roles that have autoscaling."
    )
