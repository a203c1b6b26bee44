"""The router's settings, in three layers: the cluster config (`--config`, the operator's cluster.json: the
contract in kvferry/cluster_config.py), a router file (`--router-config`, YAML or JSON in snake_case:
policies, plugins, limits) over it, and flags over both; see docs/router.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvferry.cluster_config import ClusterConfig, load_cluster_config
from kvferry.router.scheduling.policies import POLICIES, Policy
from kvferry.tls.client import NodeTrust

# What a request field kvferry does not implement gets: a 400 naming it (OpenAI's way), or a logged warning.
UnsupportedFields = Literal["reject", "warn"]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelSection(_Section):
    path: str
    served_name: str | None = None
    chat_template: str | None = None  # a Jinja file to use instead of the model's own template
    max_model_len: int | None = None  # default: the nodes' reports, else config.json (capped at 8192)

    def chat_template_source(self) -> str | None:
        """The chat_template file's text; None: the model's own template."""
        if self.chat_template is None:
            return None
        try:
            return Path(self.chat_template).read_text()
        except OSError as exc:
            raise ValueError(f"model.chat_template: cannot read {self.chat_template}: {exc.strerror}") from None


class RedisSection(_Section):
    url: str | None = None  # the prefix index and, unless `registry` says otherwise, the node registry


class DiscoverySection(_Section):
    mode: Literal["static", "registry", "kubernetes"] = "static"
    prefill: list[str] = Field(default_factory=list)  # static URLs
    decode: list[str] = Field(default_factory=list)
    namespace: str | None = None  # kubernetes: default the router pod's own
    port: int = 8000
    selectors: dict[Literal["prefill", "decode"], dict[str, str]] = Field(default_factory=dict)
    kubeconfig: str | None = None  # default: in-cluster config


class InternalTLSSection(_Section):
    """The router speaks HTTPS to its nodes (kvferry/tls/client.py)."""

    ca_file: str  # the CA bundle that signs the nodes' certificates, reloaded when it changes
    server_name: str | None = None  # the name every node's certificate carries; default: the address dialled

    @field_validator("ca_file")
    @classmethod
    def _loads(cls, ca_file: str) -> str:
        try:  # said at start, naming the file, not as the first node call's SSL error
            NodeTrust(ca_file).context()
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot load the CA bundle {ca_file}: {exc}") from None
        return ca_file

    def node_trust(self) -> NodeTrust:
        return NodeTrust(self.ca_file, self.server_name)


class PluginSection(_Section):
    name: str  # an entry point of the group kvferry.plugins, or "module:attribute"
    options: dict[str, Any] = Field(default_factory=dict)


class PolicySection(_Section):
    prefill: dict[str, float] = Field(default_factory=dict)
    decode: dict[str, float] = Field(default_factory=dict)


class RouterConfig(_Section):
    model: ModelSection
    redis: RedisSection = RedisSection()
    registry: str | None = None  # redis:// or file:// URL of the node registry; default redis.url
    discovery: DiscoverySection = DiscoverySection()
    policy: str = "default"
    policies: dict[str, PolicySection] = Field(default_factory=dict)  # custom weights by name
    plugins: list[PluginSection] = Field(default_factory=list)  # run in this order
    api_keys: list[str] = Field(default_factory=list)
    metrics_need_auth: bool = False
    # The nodes' shared token (a mounted Secret), sent on every call to a node; default the
    # KVFERRY_CLUSTER_TOKEN variable; neither: calls go without one (nodes that have none accept them).
    cluster_token_file: str | None = None
    # HTTPS to the nodes; None: plain HTTP. With it, a node URL that is not https:// is refused (static) or
    # ignored (registry records), so the cluster token never crosses in the clear.
    internal_tls: InternalTLSSection | None = None
    max_inflight: int = Field(256, ge=1)  # requests beyond it get 429
    max_body_bytes: int = Field(1 << 20, ge=1024)
    default_max_tokens: int | None = None  # chat without max_tokens: default the rest of the context
    health_interval_seconds: float = Field(2.0, gt=0)
    # A node's /health answers at once unless its machine is starved; raise it on an overloaded host.
    probe_timeout_seconds: float = Field(1.0, gt=0)
    stale_record_seconds: float = Field(15.0, gt=0)  # three missed heartbeats: the node is dead
    prefill_timeout_seconds: float = Field(60.0, gt=0)
    # A stream whose decode node is lost goes on on another one (router/dispatch/migration.py) this many
    # times; 0: the client gets the error.
    max_migrations: int = Field(1, ge=0)
    # How long the router counts a prompt's blocks as cached on the node it sent them to, before the node's
    # own index entries take over (router/scheduling/routing_history.py); 0 turns the history off.
    routing_history_seconds: float = Field(30.0, ge=0)
    # The P/D decision (router/scheduling/pd_decision.py): always disaggregate when a prefill node is up,
    # never, or auto: from the measured costs, with this threshold of uncached tokens until measured.
    disaggregation: Literal["always", "auto", "never"] = "always"
    disaggregation_min_tokens: int = Field(256, ge=0)
    unsupported_fields: UnsupportedFields = "reject"
    # How the model writes the tool calls it chooses (`tool_choice: auto`): auto, from its chat template.
    tool_call_parser: Literal["auto", "hermes", "llama3_json"] = "auto"
    # A thinking model's `<think>` blocks go to reasoning_content: auto, where its chat template writes them.
    reasoning_parser: Literal["auto", "think", "none"] = "auto"
    # How long /v1/responses keeps a stored response (for previous_response_id): in Redis where redis.url is
    # set, else in the router's memory.
    response_ttl_seconds: float = Field(86400.0, gt=0)
    # How long a conversation's next turn prefers the nodes of its last (router/scheduling/sessions.py); 0: never.
    session_ttl_seconds: float = Field(600.0, ge=0)

    @model_validator(mode="after")
    def _known_policy(self) -> RouterConfig:
        self.resolve_policy()
        return self

    @model_validator(mode="after")
    def _static_nodes_over_tls(self) -> RouterConfig:
        plain = [url for url in self.discovery.prefill + self.discovery.decode if not url.startswith("https://")]
        if self.internal_tls is not None and plain:
            raise ValueError(f"internal_tls is on, but node URLs {plain} are not https://")
        return self

    @property
    def node_scheme(self) -> str:
        """How the router speaks to its nodes: https with internal_tls, else http."""
        return "http" if self.internal_tls is None else "https"

    @property
    def served_model_name(self) -> str:
        return self.model.served_name or Path(self.model.path).name

    @property
    def registry_url(self) -> str | None:
        return self.registry or self.redis.url

    def resolve_policy(self) -> Policy:
        if self.policy in self.policies:
            custom = self.policies[self.policy]
            return Policy(self.policy, prefill=custom.prefill, decode=custom.decode)
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; built in: {sorted(POLICIES)}, configured: {sorted(self.policies)}")
        return POLICIES[self.policy]


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Nested dicts merged key by key; a None override leaves the base value alone."""
    merged = dict(base)
    for key, value in overrides.items():
        if value is None:
            continue
        if isinstance(value, dict):
            merged[key] = merge(merged[key] if isinstance(merged.get(key), dict) else {}, value)
        else:
            merged[key] = value
    return merged


def _from_cluster_config(cluster: ClusterConfig) -> dict[str, Any]:
    """What the router takes from the contract (kvferry/cluster_config.py lists who reads which field): the
    model and its served name (the nodes salt their block hashes with the same), Redis, and where the
    operator's node pods are."""
    model, discovery = cluster.model, cluster.discovery
    return {
        "model": {"path": model.path, "served_name": model.served_name},
        "redis": {"url": cluster.redis.url},
        "discovery": {"mode": "kubernetes", "namespace": discovery.namespace, "port": discovery.port,
                      "selectors": discovery.selectors},
    }


def load_config(path: str | Path | None, overrides: dict[str, Any], cluster_config: str | Path | None = None) -> RouterConfig:
    """The cluster config (if any), the router file `path` (if any) over it, and `overrides` (flags, None
    where not given) over both. Raises ValueError: a pydantic ValidationError for a bad setting, a
    ClusterConfigError naming the cluster config's file and field."""
    document = _from_cluster_config(load_cluster_config(cluster_config)) if cluster_config is not None else {}
    if path is not None:
        router_file = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(router_file, dict):
            raise ValueError(f"{path}: the router config must be a mapping")
        document = merge(document, router_file)
    return RouterConfig.model_validate(merge(document, overrides))
