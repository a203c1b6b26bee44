"""A node's settings and their command-line flags. Kept apart from the runtime so that building the CLI
parser loads neither torch nor UCX (an operator or router process never needs them)."""

from __future__ import annotations

import argparse
import ipaddress
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeConfig:
    role: str  # "prefill" or "decode"
    name: str
    model: str
    registry: str  # redis://..., file:///folder
    host: str = "127.0.0.1"
    port: int = 8100
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    num_kv_blocks: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    gpu_memory_fraction: float = 0.9
    kv_cache_bytes: int | None = None
    transfer_timeout_seconds: float = 2.0
    lease_seconds: float = 5.0
    # The shared secret every call to the internal API must bear; None: the internal API is open.
    # Kept out of repr, so that a logged config does not print it.
    cluster_token: str | None = field(default=None, repr=False)


def add_node_arguments(parser: argparse.ArgumentParser, role: str) -> None:
    parser.add_argument("--model", required=True, help="Hugging Face model folder")
    parser.add_argument("--name", default=f"{role}-0", help="this node's name in the registry")
    parser.add_argument("--registry", required=True, help="redis://host:port/db or file:///shared/folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="auto", help="cpu, cuda or cuda:N (a prefill node on one GPU, decode on another)")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="requests in one batch")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048, help="tokens per step (the prefill chunk)")
    parser.add_argument(
        "--gpu-memory-fraction", type=float, default=0.9,
        help="share of the GPU this node may fill (two nodes on one GPU: e.g. 0.45 each)",
    )
    parser.add_argument("--kv-cache-bytes", type=int, default=None, help="KV pool size (default: from the memory fraction on CUDA, 1 GiB on the CPU)")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--num-kv-blocks", type=int, default=None)
    parser.add_argument("--transfer-timeout", type=float, default=2.0, help="seconds before a KV transfer fails")
    parser.add_argument("--lease", type=float, default=5.0, help="seconds a decode node holds blocks for KV to arrive")
    parser.add_argument(
        "--cluster-token-file", default=None,
        help="file holding the token the internal API requires (a mounted Secret); default: env "
        "KVFERRY_CLUSTER_TOKEN; neither: the internal API is open",
    )


def node_config_from(args: argparse.Namespace, role: str) -> NodeConfig:
    # Imported here: the router's auth module loads FastAPI, which building the parser must not.
    from kvferry.router.auth import cluster_token_from

    return NodeConfig(
        role=role, name=args.name, model=args.model, registry=args.registry, host=args.host, port=args.port,
        dtype=args.dtype, device=args.device, max_model_len=args.max_model_len, num_kv_blocks=args.num_kv_blocks,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_fraction=args.gpu_memory_fraction, kv_cache_bytes=args.kv_cache_bytes,
        transfer_timeout_seconds=args.transfer_timeout, lease_seconds=args.lease,
        cluster_token=cluster_token_from(args.cluster_token_file),
    )


def transfer_environment(host: str) -> dict[str, str]:
    """UCX settings that follow the address the node serves on. UCX's TCP transport listens on the address
    of every network device it uses, all of them by default: a node bound to loopback keeps UCX on `lo`
    too. Any other address leaves the choice to UCX (set UCX_NET_DEVICES to pick: RDMA devices are not
    network interfaces, so no device list follows from an IP address)."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        loopback = False
    return {"UCX_NET_DEVICES": "lo"} if loopback else {}
