"""CUDA pool to CUDA pool through UCX's CUDA transports, two processes on one GPU (skips without CUDA)."""

from __future__ import annotations

import random
import time

import pytest
import torch
from support.peer_process import PeerProcess
from support.refused_writes import refused_around_one_accepted
from support.transfer_peer import block_digests, fill_random, make_pool

from kvferry.transfer import TransferEngine
from kvferry.transfer.kv_connector import DestinationHandle, KVSender, pool_description

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_cuda_blocks_arrive_byte_identical(tmp_path, dtype):
    registry = f"file://{tmp_path}"
    pool = make_pool(dtype, 512, device="cuda")
    fill_random(pool, seed=2)
    engine = TransferEngine()
    engine.initialize("prefill-gpu", registry, "ucx", pool=pool_description("tiny", pool))
    receiver = PeerProcess("decode-gpu", registry, dtype=dtype, num_blocks=512, device="cuda")
    try:
        sender = KVSender(engine, pool, "tiny")
        rng = random.Random(0)
        src = rng.sample(range(1, 512), 100)
        dst = rng.sample(range(1, 512), 100)
        handle = DestinationHandle.from_json(receiver.call("expect", request_id="g", block_ids=dst)["handle"])
        sender.send_blocks("g", src, handle)
        assert receiver.call("wait", request_id="g")["arrived"]
        assert receiver.call("digest", block_ids=dst)["digests"] == block_digests(pool, src)
    finally:
        receiver.close()
        engine.close()


def test_refused_eager_cuda_writes_are_drained_and_the_next_write_lands(tmp_path):
    """A write from device memory sends its messages with the request (eager): refused, the target drains
    them without taking their data, so its blocks keep what they held, and nothing is left in flight."""
    registry = f"file://{tmp_path}"
    pool = make_pool("bfloat16", 64, device="cuda")
    fill_random(pool, seed=3)
    engine = TransferEngine()
    engine.initialize("prefill-gpu", registry, "ucx", pool=pool_description("tiny", pool))
    receiver = PeerProcess("decode-gpu", registry, dtype="bfloat16", num_blocks=64, device="cuda")
    try:
        sender = KVSender(engine, pool, "tiny")
        refused_around_one_accepted(sender, receiver, "a", [1, 2], [20, 21])
        handle = DestinationHandle.from_json(receiver.call("expect", request_id="b", block_ids=[30, 31])["handle"])
        sender.send_blocks("b", [7, 8], handle)
        assert receiver.call("wait", request_id="b")["arrived"]
        digests = receiver.call("digest", block_ids=[20, 21, 30, 31])["digests"]
        assert digests == block_digests(pool, [1, 2, 7, 8])
        deadline = time.monotonic() + 5
        while (stats := receiver.call("stats")["stats"])["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stats["rejected_writes"] == 3
        assert stats["in_flight"] == 0 and engine.in_flight() == 0
    finally:
        receiver.close()
        engine.close()
