"""One side of a transfer-benchmark pair, driven by JSON lines (one reply per command).

    python -m benchmarks.transfer_peers.peer --system kvferry --role target --name t --buffer-bytes N \
        --cmd-fd 5 --reply-fd 6 [--registry redis://127.0.0.1:PORT/0]

Commands and replies travel over two inherited pipe descriptors, not stdin/stdout: UCX, NIXL and
Mooncake print to stdout and stderr (UCX_PROTO_INFO=y tables, glog lines), and those go to a log file
that the benchmark reads for the transports used.

Commands: connect {remote} / clear / digest {nbytes} / run {batch, runs, coalesce} / quit.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import traceback
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.transfer_peers.systems import SYSTEMS, System
from benchmarks.transfer_peers.workload import Batch, digest, source_bytes


def ucx_versions() -> dict[str, str]:
    """The version of every libucp this process has loaded (kvferry's ucxx wheel and NIXL each bring one)."""
    paths = sorted(
        {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "libucp" in line}
    )
    versions = {}
    for path in paths:
        try:
            function = ctypes.CDLL(path).ucp_get_version_string
            function.restype = ctypes.c_char_p
            versions[path] = function().decode()
        except (OSError, AttributeError) as exc:
            versions[path] = f"unknown ({exc})"
    return versions


def handle(system: System, buffer: np.ndarray, command: dict[str, Any]) -> dict[str, Any]:
    kind = command["cmd"]
    if kind == "connect":
        system.connect(command["remote"])
    elif kind == "clear":
        buffer[:] = 0
    elif kind == "digest":
        return {"digest": digest(buffer, int(command["nbytes"]))}
    elif kind == "run":
        batch = Batch.from_json(command["batch"])
        return {"latencies": system.run(batch, int(command["runs"]), command)}
    elif kind == "versions":
        return {"ucx": ucx_versions()}
    elif kind != "quit":
        raise ValueError(f"unknown command {kind!r}")
    return {}


def serve(system: System, buffer: np.ndarray, commands: Any, replies: Any) -> None:
    for line in commands:
        command = json.loads(line)
        try:
            reply = {"ok": True, **handle(system, buffer, command)}
        except Exception as exc:  # noqa: BLE001 - reported to the benchmark, which records the reason
            traceback.print_exc()
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
        if command["cmd"] == "quit":
            return


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", choices=sorted(SYSTEMS), required=True)
    parser.add_argument("--role", choices=("target", "initiator"), required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--buffer-bytes", type=int, required=True)
    parser.add_argument("--cmd-fd", type=int, required=True)
    parser.add_argument("--reply-fd", type=int, required=True)
    parser.add_argument("--registry", default="")
    args = parser.parse_args()
    commands = os.fdopen(args.cmd_fd, "r")
    replies = os.fdopen(args.reply_fd, "w")
    # The initiator holds the data; the target starts from zeros, so a checksum proves arrival.
    buffer = (
        source_bytes(args.buffer_bytes)
        if args.role == "initiator"
        else np.zeros(args.buffer_bytes, dtype=np.uint8)
    )
    system: System = SYSTEMS[args.system]()
    try:
        info = system.setup(args.name, args.role, buffer, {"registry": args.registry})
        buffer = getattr(system, "buffer", buffer)  # a system may hold the data in memory of its own
        replies.write(json.dumps({"ok": True, "info": info}) + "\n")
    except Exception as exc:  # noqa: BLE001 - the benchmark records why this system has no numbers
        traceback.print_exc()
        replies.write(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return
    finally:
        replies.flush()
    serve(system, buffer, commands, replies)
    system.close()


if __name__ == "__main__":
    main()
