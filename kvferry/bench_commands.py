"""`kvferry bench`: the load generator of kvferry/loadgen/ against any OpenAI-compatible server.

The benchmarks of kvferry itself are not commands of the installed package: they run from a checkout as
`python -m benchmarks.<name>` (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from kvferry.loadgen.command import add_arguments, bench

    load = subparsers.add_parser("bench", help="load generator: streaming OpenAI requests, latency percentiles, goodput")
    add_arguments(load)
    load.set_defaults(func=bench)
