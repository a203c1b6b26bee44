"""Prefill on one engine, decode on another: the prompt's KV moves between their pools over the real
transfer engine (UCX, two workers in this process), and greedy output equals the colocated engine's."""

from __future__ import annotations

import random

import pytest

from kvferry.engine import LLMEngine, SamplingParams
from kvferry.engine.engine_args import EngineArgs
from kvferry.kvcache import InMemoryRegistry, OutOfBlocksError
from kvferry.transfer import TransferEngine
from kvferry.transfer.kv_connector import KVReceiver, KVSender

MODEL = "tiny"


@pytest.fixture
def pair(tiny_models):
    registry = InMemoryRegistry()
    args = EngineArgs(dtype="float32", max_model_len=512, num_kv_blocks=200)
    prefill, decode = LLMEngine(tiny_models["qwen3"], args), LLMEngine(tiny_models["qwen3"], args)
    p_transfer, d_transfer = TransferEngine(), TransferEngine()
    p_transfer.initialize("prefill-0", registry)
    d_transfer.initialize("decode-0", registry)
    sender = KVSender(p_transfer, prefill.pool, MODEL)
    receiver = KVReceiver(d_transfer, decode.pool, MODEL)
    yield prefill, decode, sender, receiver
    p_transfer.close()
    d_transfer.close()
    for engine in (prefill, decode):
        stats = engine.allocator.check_integrity()
        assert stats.in_use == 0, stats


def _run(engine: LLMEngine) -> dict[str, list[int]]:
    done = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                done[output.request_id] = output.outputs[0].token_ids
    return done


def _disaggregated(prefill, decode, sender, receiver, request_id, prompt, max_tokens):
    """The request flow of one request: P prefills and holds, D reserves, KV travels, D decodes."""
    prefill.add_request(request_id, prompt, SamplingParams(temperature=0, max_tokens=1), hold_kv=True)
    first = list(_run_until_finished(prefill, request_id))[-1]
    reservation = decode.reserve(request_id, prompt, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    handle = receiver.expect(request_id, reservation.block_ids, reservation.first_block)
    sent = sender.send_blocks(request_id, first.kv_block_ids, handle)
    assert receiver.wait(handle)
    receiver.release(handle)
    prefill.release_kv(request_id)
    decode.activate(request_id)  # D computes the last prompt token and samples token 1 itself
    return reservation, sent


def _run_until_finished(engine, request_id):
    while True:
        for output in engine.step():
            if output.request_id == request_id:
                yield output
                if output.finished:
                    return


def test_greedy_tokens_equal_the_colocated_engine(tiny_models, pair):
    prefill, decode, sender, receiver = pair
    rng = random.Random(1)
    prompts = [{"prompt_token_ids": [rng.randrange(1000) for _ in range(n)]} for n in (3, 16, 40, 77, 150)]
    colocated = LLMEngine(tiny_models["qwen3"], EngineArgs(dtype="float32", max_model_len=512))
    for i, prompt in enumerate(prompts):
        colocated.add_request(f"c{i}", prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    expected = _run(colocated)
    for i, prompt in enumerate(prompts):  # all five decode together in D's batch
        _disaggregated(prefill, decode, sender, receiver, f"r{i}", prompt, 20)
    got = _run(decode)
    assert [got[f"r{i}"] for i in range(len(prompts))] == [expected[f"c{i}"] for i in range(len(prompts))]


def test_a_second_turn_sends_only_the_blocks_decode_lacks(pair):
    prefill, decode, sender, receiver = pair
    first_prompt = list(range(100, 180))  # 80 tokens: 5 full blocks
    _disaggregated(prefill, decode, sender, receiver, "turn1", {"prompt_token_ids": first_prompt}, 8)
    history = first_prompt + _run(decode)["turn1"]
    second_prompt = history + list(range(300, 340))
    reservation, sent = _disaggregated(prefill, decode, sender, receiver, "turn2", {"prompt_token_ids": second_prompt}, 8)
    assert reservation.first_block == (len(history) - 1) // 16  # D's own cache covers the history
    total_blocks = -(-len(second_prompt) // 16)
    assert sent == (total_blocks - reservation.first_block) * decode.pool.block_bytes()
    _run(decode)


def test_a_reservation_that_cannot_fit_is_refused_and_leaves_nothing_behind(pair):
    _, decode, _, _ = pair
    with pytest.raises(OutOfBlocksError):
        for i in range(20):  # 20 x 32 blocks exceed the 199 usable ones
            decode.reserve(f"fill{i}", {"prompt_token_ids": list(range(500))}, SamplingParams(max_tokens=4))
    for request_id in list(decode.reserved):
        decode.cancel_reservation(request_id)
    assert decode.allocator.stats().in_use == 0
