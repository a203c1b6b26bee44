"""CUDA pool to CUDA pool through UCX's CUDA transports, two processes on one GPU (skips without CUDA)."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from support.peer_process import PeerProcess
from support.refused_writes import refused_around_one_accepted
from support.transfer_peer import block_digests, fill_random, make_pool

from kvferry.kvcache.kv_pool import KVPool
from kvferry.transfer import TransferEngine
from kvferry.transfer.kv_connector import DestinationHandle, KVSender, pool_description

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@contextmanager
def cuda_pools(tmp_path, dtype: str, num_blocks: int, seed: int) -> Iterator[tuple[TransferEngine, KVPool, KVSender, PeerProcess]]:
    """This process's CUDA pool (random) behind a KVSender, and a decode peer process with its own."""
    registry = f"file://{tmp_path}"
    pool = make_pool(dtype, num_blocks, device="cuda")
    fill_random(pool, seed=seed)
    engine = TransferEngine()
    engine.initialize("prefill-gpu", registry, "ucx", pool=pool_description("tiny", pool))
    receiver = PeerProcess("decode-gpu", registry, dtype=dtype, num_blocks=num_blocks, device="cuda")
    try:
        yield engine, pool, KVSender(engine, pool, "tiny"), receiver
    finally:
        receiver.close()
        engine.close()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_cuda_blocks_arrive_byte_identical(tmp_path, dtype):
    with cuda_pools(tmp_path, dtype, 512, seed=2) as (_, pool, sender, receiver):
        rng = random.Random(0)
        src = rng.sample(range(1, 512), 100)
        dst = rng.sample(range(1, 512), 100)
        handle = DestinationHandle.from_json(receiver.call("expect", request_id="g", block_ids=dst)["handle"])
        sender.send_blocks("g", src, handle)
        assert receiver.call("wait", request_id="g")["arrived"]
        assert receiver.call("digest", block_ids=dst)["digests"] == block_digests(pool, src)


def test_refused_eager_cuda_writes_are_drained_and_the_next_write_lands(tmp_path):
    """A write from device memory sends its messages with the request (eager): refused, the target drains
    them without taking their data, so its blocks keep what they held, and nothing is left in flight."""
    with cuda_pools(tmp_path, "bfloat16", 64, seed=3) as (engine, pool, sender, receiver):
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


def test_prepared_cuda_writes_land_and_a_misfit_source_is_written_anyway(tmp_path):
    """Prepared before the data (as the prefill node does around its prefill): the target posts its receives
    into the lease, the data follows later; a source that splits a prepared run is withdrawn and written
    as an ordinary eager write."""
    with cuda_pools(tmp_path, "bfloat16", 128, seed=4) as (engine, pool, sender, receiver):
        fits = DestinationHandle.from_json(receiver.call("expect", request_id="fit", block_ids=[40, 41, 42, 60])["handle"])
        misfit = DestinationHandle.from_json(receiver.call("expect", request_id="mis", block_ids=[80, 81])["handle"])
        prepared = [sender.prepare(fits), sender.prepare(misfit)]
        time.sleep(0.3)  # the prefill computing
        assert sender.send_blocks("fit", [3, 4, 5, 9], fits, prepared[0]) == 4 * pool.block_bytes()
        assert sender.send_blocks("mis", [11, 2], misfit, prepared[1]) == 2 * pool.block_bytes()
        for request_id in ("fit", "mis"):
            assert receiver.call("wait", request_id=request_id)["arrived"]
        assert receiver.call("digest", block_ids=[40, 41, 42, 60, 80, 81])["digests"] == block_digests(pool, [3, 4, 5, 9, 11, 2])
        stats = receiver.call("stats")["stats"]
        assert (stats["writes_received"], stats["withdrawn_writes"]) == (2, 1)
        assert stats["in_flight"] == 0 and engine.in_flight() == 0
