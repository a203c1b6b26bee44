"""CUDA pool to CUDA pool through UCX's CUDA transports, two processes on one GPU (skips without CUDA)."""

from __future__ import annotations

import random

import pytest
import torch
from support.peer_process import PeerProcess
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
