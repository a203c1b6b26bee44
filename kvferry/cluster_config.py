"""The cluster contract: the one document the operator renders into an InferenceCluster's ConfigMap and
that `kvferry prefill|decode|router --config FILE` read.

Both sides use this model: the operator builds it (operator/build_config.py), the nodes and the router
load it with `load_cluster_config`, so a field one side writes and the other does not know is an error
when the operator renders it, not a pod that ignores it. Who reads each field:

| field | prefill and decode nodes (kvferry/node/config.py) | router (router/config.py) |
| --- | --- | --- |
| `model.path` | the weights and tokenizer | the tokenizer and chat template |
| `model.servedName` | the prefix-hash salt and registry record | the API's model name, the prefix-index keys |
| `model.quantization` | FP8 or int8 weights (`--quantization`) | - |
| `kvCache.*` | block size, memory fraction, dtype of the engine | - (block size from the nodes' records) |
| `transfer.*` | the transfer engine's protocol, UCX_TLS | - |
| `redis.url` | the node registry and the prefix index | the node registry and the prefix index |
| `discovery.*` | - | Kubernetes discovery: namespace, selectors, the nodes' port |

What differs per pod (its name and address) is not in it: the operator passes the pod's name and IP from
the downward API as flags. Flags override the file on every role. Nor is a Redis password (a ConfigMap is
no place for one): pods get it in `KVFERRY_REDIS_PASSWORD` from a Secret, and `load_cluster_config` puts
it into `redis.url`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from kvferry.redis_password import REDIS_PASSWORD_ENV, with_password

NodeRole = Literal["prefill", "decode"]


class _Section(BaseModel):
    # camelCase in the file, as in the InferenceCluster it comes from; an unknown field is an error, so a
    # field the operator writes is one some process reads.
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)


class ModelSection(_Section):
    path: str = Field(min_length=1)
    # One name for nodes and router: it salts the nodes' block hashes, so the router's prefix-index
    # lookups find the nodes' blocks only when the two agree.
    served_name: str = Field(min_length=1)
    quantization: Literal["fp8", "int8", "int4"] | None = None  # the nodes' weights; activations and KV keep kvCache.dtype


class KVCacheSection(_Section):
    block_size: int = Field(ge=1)
    memory_fraction: float = Field(gt=0, le=1)
    dtype: Literal["auto", "float16", "bfloat16", "float32"]


class TransferSection(_Section):
    protocol: Literal["ucx"]
    ucx_transports: tuple[str, ...] = ()  # UCX_TLS; empty lets UCX choose


class RedisSection(_Section):
    url: str | None = None  # None: no prefix index, and no registry shared between pods


class DiscoverySection(_Section):
    namespace: str = Field(min_length=1)
    port: int = Field(ge=1, le=65535)  # where every node serves; nodes are started with the same port
    selectors: dict[NodeRole, dict[str, str]]


class ClusterConfig(_Section):
    model: ModelSection
    kv_cache: KVCacheSection
    transfer: TransferSection
    redis: RedisSection
    discovery: DiscoverySection

    def to_json(self) -> str:
        return json.dumps(self.model_dump(by_alias=True, mode="json"), indent=2, sort_keys=True) + "\n"


class ClusterConfigError(ValueError):
    """A cluster config file that cannot be read or does not follow the contract; the message names the
    file and each field."""


def load_cluster_config(path: str | Path, environ: Mapping[str, str] = os.environ) -> ClusterConfig:
    """The file's config, its Redis URL given the password in $KVFERRY_REDIS_PASSWORD (redis_password.py)."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ClusterConfigError(f"{path}: cannot read the cluster config: {exc}") from None
    try:
        config = ClusterConfig.model_validate(document)
    except ValidationError as error:
        problems = [f"{path}: {'.'.join(str(part) for part in item['loc']) or '(document)'}: {item['msg']}"
                    for item in error.errors()]
        raise ClusterConfigError("\n".join(problems)) from None
    password = environ.get(REDIS_PASSWORD_ENV)
    if password and config.redis.url:
        config = config.model_copy(update={"redis": RedisSection(url=with_password(config.redis.url, password))})
    return config
