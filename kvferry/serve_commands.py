"""CLI subcommands that serve: `kvferry prefill`, `decode`, `router`, and `up` (a whole local cluster)."""

from __future__ import annotations

import argparse

from kvferry.node_runtime import add_node_arguments, node_config_from


def register(subparsers: argparse._SubParsersAction) -> None:
    for role in ("prefill", "decode"):
        parser = subparsers.add_parser(role, help=f"run a {role} node")
        add_node_arguments(parser, role)
        parser.set_defaults(func=_serve_node, role=role)

    router = subparsers.add_parser("router", help="run the OpenAI-compatible router (minimal, static node lists)")
    router.add_argument("--model", required=True, help="the model folder (for its tokenizer)")
    router.add_argument("--served-model-name", default=None)
    router.add_argument("--prefill", action="append", required=True, help="a prefill node URL; repeat for more")
    router.add_argument("--decode", action="append", required=True, help="a decode node URL; repeat for more")
    router.add_argument("--host", default="127.0.0.1")
    router.add_argument("--port", type=int, default=8000)
    router.set_defaults(func=_serve_router)

    up = subparsers.add_parser("up", help="start redis (if found), prefill and decode nodes and the router locally")
    up.add_argument("--model", default=None, help="model folder; default: a tiny random checkpoint (random text)")
    up.add_argument("--prefill", type=int, default=1, help="how many prefill nodes")
    up.add_argument("--decode", type=int, default=1, help="how many decode nodes")
    up.add_argument("--redis-url", default=None, help="use this Redis; default: start redis-server if installed")
    up.add_argument("--port", type=int, default=8000, help="the router's port")
    up.set_defaults(func=_up)


def _serve_node(args: argparse.Namespace) -> int:
    import uvicorn

    from kvferry.node_runtime import NodeRuntime

    config = node_config_from(args, args.role)
    runtime = NodeRuntime.start(config)
    if args.role == "prefill":
        from kvferry.prefill_node.server import create_app
    else:
        from kvferry.decode_node.server import create_app
    # A bounded graceful shutdown: keep-alive connections from a router must not hold a node up.
    uvicorn.run(create_app(runtime), host=config.host, port=config.port, log_level="warning", timeout_graceful_shutdown=3)
    return 0


def _serve_router(args: argparse.Namespace) -> int:
    from pathlib import Path

    import uvicorn

    from kvferry.router.minimal import create_app

    name = args.served_model_name or Path(args.model).name
    uvicorn.run(
        create_app(args.model, name, args.prefill, args.decode), host=args.host, port=args.port, log_level="warning",
        timeout_graceful_shutdown=3,
    )
    return 0


def _up(args: argparse.Namespace) -> int:
    from kvferry.local_cluster import run_local_cluster

    return run_local_cluster(args.model, args.prefill, args.decode, args.redis_url, args.port)
