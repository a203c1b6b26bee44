"""A node's settings and their command-line flags, over the cluster config (`--config`, the contract in
kvferry/cluster_config.py) when there is one. Kept apart from the runtime so that building the CLI parser
loads neither torch nor UCX (an operator or router process never needs them)."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvferry.tls.files import ServingFiles, add_serving_arguments

if TYPE_CHECKING:
    from kvferry.cluster_config import ClusterConfig

# A registry inside the process: without a shared one no peer can look this node up, so KV blocks never
# reach it from a prefill node and a decode node prefills every request itself.
PROCESS_REGISTRY = "memory://"


@dataclass(frozen=True)
class NodeConfig:
    role: str  # "prefill" or "decode"
    name: str
    model: str
    registry: str = PROCESS_REGISTRY  # redis://..., file:///folder
    # The model's name in the API: it salts the block hashes, so it must be the router's (default the folder's).
    served_model_name: str | None = None
    host: str = "127.0.0.1"  # where the HTTP server listens
    port: int = 8100
    # Where the router and peers reach this node (a pod's IP); default `host`. Published as the node's URL.
    advertise_host: str | None = None
    dtype: str = "auto"
    quantization: str | None = None  # "fp8", "int8" or "int4" weights (EngineArgs.quantization)
    device: str = "auto"
    max_model_len: int | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    gpu_memory_fraction: float = 0.9
    kv_cache_bytes: int | None = None
    transfer_protocol: str = "ucx"
    ucx_transports: tuple[str, ...] = ()  # UCX_TLS unless the environment sets it; empty: UCX chooses
    transfer_timeout_seconds: float = 2.0
    lease_seconds: float = 5.0
    # After SIGTERM (a pod deleted, a node drained): how long streams may go on before they are cut; a router
    # migrates a cut stream to another decode node. Kept under the pod's terminationGracePeriodSeconds.
    shutdown_grace_seconds: float = 3.0
    # The shared secret every call to the internal API must bear; None: the internal API is open.
    # Kept out of repr, so that a logged config does not print it.
    cluster_token: str | None = field(default=None, repr=False)
    # HTTPS only, with this certificate and key (reloaded when they change); the published URL is https://.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    def __post_init__(self) -> None:
        ServingFiles.from_flags(self.tls_cert_file, self.tls_key_file)  # raises now for a pair that is not one
        host = self.advertise_host or self.host
        if "$(" in host:
            raise ValueError(f"advertised host {host!r} was never expanded: the pod lacks the variable it names")
        if _is_unspecified(host):
            raise ValueError(f"{host} listens on every address but reaches none: pass --advertise-host "
                             "(the address the router and peers use, e.g. the pod's IP)")

    @property
    def serving_files(self) -> ServingFiles | None:
        return None if self.tls_cert_file is None or self.tls_key_file is None else ServingFiles(self.tls_cert_file, self.tls_key_file)

    @property
    def url(self) -> str:
        return node_url(self.advertise_host or self.host, self.port, "http" if self.serving_files is None else "https")


def node_url(host: str, port: int, scheme: str) -> str:
    """The URL a node publishes in its registry record. The router's Kubernetes discovery builds the same
    from a pod's IP, and the router joins the two by URL: one function, so they cannot differ."""
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def _is_unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:  # a host name
        return False


def add_node_arguments(parser: argparse.ArgumentParser, role: str) -> None:
    # Flags default to None: a flag given overrides the cluster config, one left out leaves it (or
    # NodeConfig's default) alone.
    parser.add_argument("--config", default=None, help="the cluster config (the operator's cluster.json); flags win")
    parser.add_argument("--model", default=None, help="Hugging Face model folder or .gguf file (default: the config's model.path)")
    parser.add_argument("--served-model-name", default=None,
                        help="the model's name in the API and the prefix-hash salt; must match the router's "
                        "(default: the config's model.servedName, else the folder's name)")
    parser.add_argument("--name", default=f"{role}-0", help="this node's name in the registry (default: %(default)s)")
    parser.add_argument("--registry", default=None,
                        help="redis://host:port/db or file:///shared/folder (default: the config's redis.url, else "
                        "memory://: this process alone, so no peer can send this node KV)")
    parser.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port to listen on (default 8100)")
    parser.add_argument("--advertise-host", default=None,
                        help="address the router and peers reach this node at, in its published URL (default --host)")
    parser.add_argument("--dtype", default=None, help="weights and KV cache type (default: the config's kvCache.dtype, else auto)")
    parser.add_argument("--quantization", choices=["fp8", "int8", "int4"], default=None,
                        help="fp8: linear layers in FP8 with per-channel scales, quantized at load (an FP8 "
                        "checkpoint is read as FP8 without it); int8 (CPU only): linear layers and the LM head in "
                        "int8 with per-channel scales; int4 (CPU only): linear layers in 4 bits with a scale and a "
                        "zero per 32 weights, multiplied in bfloat16 (fastest with --dtype bfloat16); activations and the KV "
                        "cache keep --dtype")
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (a prefill node on one GPU, decode on another)")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="requests in one batch (default 64)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None, help="tokens per step, the prefill chunk (default 2048)")
    parser.add_argument(
        "--gpu-memory-fraction", type=float, default=None,
        help="share of the GPU this node may fill (two nodes on one GPU: e.g. 0.45 each; default: the config's "
        "kvCache.memoryFraction, else 0.9)",
    )
    parser.add_argument("--kv-cache-bytes", type=int, default=None, help="KV pool size (default: from the memory fraction on CUDA, 1 GiB on the CPU)")
    parser.add_argument("--block-size", type=int, default=None, help="tokens per KV block (default: the config's kvCache.blockSize, else 16)")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--num-kv-blocks", type=int, default=None)
    parser.add_argument("--transfer-timeout", dest="transfer_timeout_seconds", type=float, default=None,
                        help="seconds before a KV transfer fails (default 2)")
    parser.add_argument("--lease", dest="lease_seconds", type=float, default=None,
                        help="seconds a decode node holds blocks for KV to arrive (default 5)")
    parser.add_argument("--shutdown-grace", dest="shutdown_grace_seconds", type=float, default=None,
                        help="seconds streams may go on after SIGTERM before they are cut (default 3)")
    parser.add_argument(
        "--cluster-token-file", default=None,
        help="file holding the token the internal API requires (a mounted Secret); default: env "
        "KVFERRY_CLUSTER_TOKEN; neither: the internal API is open",
    )
    add_serving_arguments(parser)


def _from_cluster_config(cluster: ClusterConfig) -> dict[str, Any]:
    """What a node takes from the contract (kvferry/cluster_config.py lists who reads which field)."""
    model, kv, transfer = cluster.model, cluster.kv_cache, cluster.transfer
    settings: dict[str, Any] = {"model": model.path, "served_model_name": model.served_name,
                                "quantization": model.quantization}
    settings |= {"block_size": kv.block_size, "gpu_memory_fraction": kv.memory_fraction, "dtype": kv.dtype}
    settings |= {"transfer_protocol": transfer.protocol, "ucx_transports": transfer.ucx_transports}
    if cluster.redis.url is not None:
        settings["registry"] = cluster.redis.url
    return settings


def node_config_from(args: argparse.Namespace, role: str) -> NodeConfig:
    """The cluster config's settings, with every flag given on top. Raises ValueError (the cluster
    config's errors name the file and the field)."""
    # Imported here: the router's auth module loads FastAPI, and the contract pydantic, which building the
    # parser must not.
    from kvferry.cluster_config import load_cluster_config
    from kvferry.router.admission.auth import cluster_token_from

    settings = _from_cluster_config(load_cluster_config(args.config)) if args.config else {}
    flags = {f.name for f in dataclasses.fields(NodeConfig)} - {"role", "cluster_token"}
    settings |= {name: value for name, value in vars(args).items() if name in flags and value is not None}
    if "model" not in settings:
        raise ValueError("a node needs a model: --model, or --config with the cluster config")
    return NodeConfig(role=role, cluster_token=cluster_token_from(args.cluster_token_file), **settings)


def transfer_environment(config: NodeConfig) -> dict[str, str]:
    """UCX settings the node's config implies; an explicit UCX_* variable in the environment wins.

    UCX_TLS follows `ucx_transports`. UCX's TCP transport listens on the address of every network device it
    uses, all of them by default: a node bound to loopback keeps UCX on `lo` too. Any other address leaves
    the choice to UCX (set UCX_NET_DEVICES to pick: RDMA devices are not network interfaces, so no device
    list follows from an IP address)."""
    environment = {"UCX_TLS": ",".join(config.ucx_transports)} if config.ucx_transports else {}
    try:
        loopback = config.host == "localhost" or ipaddress.ip_address(config.host).is_loopback
    except ValueError:  # a host name
        loopback = False
    return environment | ({"UCX_NET_DEVICES": "lo"} if loopback else {})
