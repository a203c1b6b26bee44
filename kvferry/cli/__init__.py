"""The `kvferry` command line: one subcommand per module, each registering its own parser. This package holds
the commands that are not a component's own (the nodes and router, `kvferry up`'s local cluster, loadgen and bench)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Each module exposes `register(subparsers)`, which adds its subcommand and sets `func` on the parser.
# Imports are lazy so that `kvferry --help` does not load torch or kopf.
COMMAND_MODULES: tuple[str, ...] = (
    "kvferry.engine.commands",
    "kvferry.operator.command",
    "kvferry.cli.serve",
    "kvferry.cli.bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvferry",
        description="Disaggregated prefill/decode LLM serving: engine, nodes, router and Kubernetes operator.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
