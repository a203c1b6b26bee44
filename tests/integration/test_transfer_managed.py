"""Memory the transfer engine allocates (allocate_managed_buffer): a KV pool over it receives blocks from
a real peer process, by plain copies into the shared memory the writer attached instead of CMA puts;
one batch may mix such memory with registered memory; freed memory is refused."""

from __future__ import annotations

import ctypes
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from support.block_sets import NUM_BLOCKS, fragmented
from support.transfer_peer import block_digests, fill_random

from kvferry.engine import EngineArgs, LLMEngine, SamplingParams
from kvferry.kvcache.kv_pool import KVPool
from kvferry.transfer import TransferEngine, TransferRejectedError
from kvferry.transfer.kv_connector import KVReceiver

pytest_plugins = ["support.transfer_fixtures", "support.models"]  # local_engine, peers; tiny_models


def shared_segment_holds(address: int) -> bool:
    """Whether this process maps `address` from a System V or POSIX shared-memory segment."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if start <= address < end:
            return len(fields) > 5 and ("SYSV" in fields[5] or fields[5].startswith("/dev/shm"))
    return False


def managed_bytes(address: int, length: int) -> np.ndarray:
    return np.ctypeslib.as_array((ctypes.c_ubyte * length).from_address(address))


def test_a_pool_in_managed_memory_receives_blocks_by_plain_copies(redis_url, local_engine, peers, request):
    engine, plain = local_engine("decode")
    pool = KVPool(plain.layout, NUM_BLOCKS, "cpu", allocate=engine.allocate_managed_buffer)
    assert shared_segment_holds(pool.tensor.data_ptr())
    assert not pool.tensor.any()  # zeroed, as torch.zeros would be
    receiver = KVReceiver(engine, pool, "tiny")
    sender_name = f"prefill-{request.node.name}"
    sender = peers(sender_name, redis_url)
    sender.call("fill", seed=3)
    rng = random.Random(3)
    src, dst = fragmented(rng, 40), fragmented(rng, 40)
    handle = receiver.expect("managed", dst)
    sent = sender.call("send", handle=handle.to_json(), src_block_ids=src)
    assert sent.get("bytes") == 40 * pool.block_bytes(), sent  # a failed send says why
    assert receiver.wait(handle, timeout=5)
    assert block_digests(pool, dst) == sender.call("digest", block_ids=src)["digests"]
    stats = sender.call("stats")["stats"]
    assert stats["puts"] > 0
    assert stats["puts_copied"] == stats["puts"]  # no put went through UCX (CMA)
    assert engine.stats["writes_received"] == 1


def test_one_batch_into_managed_and_registered_memory(local_engine):
    """Copies for the ranges in attached memory, UCX puts for the others, in one write."""
    writer, source = local_engine("prefill")
    target, registered = local_engine("decode")
    fill_random(source, seed=8)
    writer.register_memory(source.tensor.data_ptr(), source.tensor.numel() * source.tensor.element_size())
    target.register_memory(registered.tensor.data_ptr(), registered.tensor.numel() * registered.tensor.element_size())
    block = source.block_bytes()
    managed = target.allocate_managed_buffer(NUM_BLOCKS * block)
    bases = {"managed": managed, "registered": registered.tensor.data_ptr()}
    kinds = ["managed", "registered"] * 20
    slots = random.Random(8).sample(range(NUM_BLOCKS), len(kinds))  # no two adjacent on both sides: 40 puts
    src = [source.tensor.data_ptr() + i * block for i in range(len(kinds))]
    dst = [bases[kind] + slot * block for kind, slot in zip(kinds, slots, strict=True)]
    assert writer.batch_transfer_write(target.local_name, src, dst, [block] * len(kinds)) == 0
    into = {"managed": managed_bytes(managed, NUM_BLOCKS * block), "registered": registered.tensor.view(-1).view(torch.uint8).numpy()}
    sent = source.tensor.view(-1).view(torch.uint8).numpy()
    for i, (kind, slot) in enumerate(zip(kinds, slots, strict=True)):
        assert np.array_equal(into[kind][slot * block : (slot + 1) * block], sent[i * block : (i + 1) * block]), (i, kind)
    assert writer.stats["puts"] == len(kinds)
    assert writer.stats["puts_copied"] == kinds.count("managed")


def test_freed_managed_memory_is_refused(local_engine):
    writer, source = local_engine("prefill")
    target, _ = local_engine("decode")
    writer.register_memory(source.tensor.data_ptr(), source.tensor.numel() * source.tensor.element_size())
    managed = target.allocate_managed_buffer(source.block_bytes())
    target.free_managed_buffer(managed, source.block_bytes())
    with pytest.raises(TransferRejectedError, match="not registered"):
        writer.batch_transfer_write(target.local_name, [source.tensor.data_ptr()], [managed], [source.block_bytes()])


def greedy_tokens(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    for number, prompt in enumerate(prompts):
        engine.add_request(str(number), {"prompt_token_ids": prompt}, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    finished = {}
    for _ in range(200):  # 12 tokens each: a few dozen steps
        finished.update({out.request_id: out.outputs[0].token_ids for out in engine.step() if out.finished})
        if not engine.has_unfinished_requests():
            break
    return [finished[str(number)] for number in range(len(prompts))]


def test_an_engine_over_managed_memory_answers_as_over_its_own(tiny_models):
    """A node allocates its pool before it starts its transfer engine (LLMEngine(pool_allocator=))."""
    transfer = TransferEngine()
    try:
        args = EngineArgs(device="cpu", num_kv_blocks=64, max_model_len=256)
        managed = LLMEngine(tiny_models["llama"], args, pool_allocator=transfer.allocate_managed_buffer)
        assert shared_segment_holds(managed.pool.tensor.data_ptr())
        prompts = [list(range(3, 40)), list(range(50, 61))]  # one prompt over two blocks, one under one
        expected = greedy_tokens(LLMEngine(tiny_models["llama"], args), prompts)
        assert [len(tokens) for tokens in expected] == [12, 12]
        assert greedy_tokens(managed, prompts) == expected
    finally:
        transfer.close()
