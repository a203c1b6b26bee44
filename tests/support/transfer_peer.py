"""A transfer-engine peer in its own process, driven by JSON lines on stdin (one reply line each).

    python -m support.transfer_peer --name decode-0 --registry redis://... --dtype bfloat16

Commands: expect / wait / digest / send / fill / stats / quit. Tests kill it, stop it (SIGSTOP) and
restart it to play the peer that dies, stalls or comes back.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys

import torch

from kvferry.engine.devices import make_current, resolve_device
from kvferry.kvcache.kv_pool import KVPool, KVPoolLayout
from kvferry.transfer import TransferConfig, TransferEngine, TransferError
from kvferry.transfer.kv_connector import DestinationHandle, KVReceiver, KVSender, pool_description


def make_pool(
    dtype: str, num_blocks: int, block_size: int = 16, num_layers: int = 2, heads: int = 2, head_dim: int = 32, device: str = "cpu"
) -> KVPool:
    return KVPool(KVPoolLayout(num_layers, heads, head_dim, block_size, dtype), num_blocks, device)


def fill_random(pool: KVPool, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    raw = pool.tensor.view(torch.int16)
    raw.copy_(torch.randint(-(2**15), 2**15, raw.shape, generator=generator, dtype=torch.int16))


def block_digests(pool: KVPool, block_ids: list[int]) -> list[str]:
    return [hashlib.sha256(pool.tensor[b].contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest() for b in block_ids]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--registry", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--num-blocks", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--lease", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=32)
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("KVFERRY_LOG_LEVEL", "WARNING"), stream=sys.stderr)

    make_current(resolve_device(args.device, torch.cuda.device_count()))  # before UCX starts and the pool is made
    pool = make_pool(args.dtype, args.num_blocks, args.block_size, args.num_layers, args.kv_heads, args.head_dim, args.device)
    engine = TransferEngine(TransferConfig(timeout_seconds=args.timeout))
    engine.initialize(args.name, args.registry, "ucx", pool=pool_description(args.model, pool))
    expired: list[str] = []
    receiver = KVReceiver(engine, pool, args.model, args.lease, on_expired=lambda rid, _: expired.append(rid))
    sender = KVSender(engine, pool, args.model)
    handles: dict[str, DestinationHandle] = {}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        kind = command["cmd"]
        reply: dict[str, object] = {"ok": True}
        try:
            if kind == "expect":
                handle = receiver.expect(command["request_id"], command["block_ids"], command.get("first_block", 0))
                handles[handle.request_id] = handle
                reply["handle"] = handle.to_json()
            elif kind == "wait":
                reply["arrived"] = receiver.wait(handles[command["request_id"]], command.get("timeout"))
                reply["expired"] = expired
            elif kind == "digest":
                reply["digests"] = block_digests(pool, command["block_ids"])
            elif kind == "fill":
                fill_random(pool, command["seed"])
            elif kind == "send":
                handle = DestinationHandle.from_json(command["handle"])
                reply["bytes"] = sender.send_blocks(handle.request_id, command["src_block_ids"], handle)
            elif kind == "stats":
                reply["stats"] = {**engine.stats, **receiver.stats, "in_flight": engine.in_flight()}
        except TransferError as exc:
            reply = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
        print(json.dumps(reply), flush=True)
        if kind == "quit":
            break
    engine.close()


if __name__ == "__main__":
    main()
