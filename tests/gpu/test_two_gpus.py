"""An engine and a KV pool on a GPU other than GPU 0 (issue [9]): the engine's kernels, graphs and events run on
the card its tensors are on, and UCX moves blocks between pools on two GPUs. Skips without CUDA; the tests
that need a second GPU skip with one."""

from __future__ import annotations

import gc
import random
import threading

import pytest
import torch
from support.peer_process import PeerProcess
from support.transfer_peer import block_digests, fill_random, make_pool

from kvferry.engine import EngineArgs, LLMEngine, SamplingParams
from kvferry.transfer import TransferEngine
from kvferry.transfer.kv_connector import DestinationHandle, KVSender, pool_description

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")

KV_CACHE_BYTES = 256 << 20
MAX_TOKENS = 16


def test_a_gpu_index_past_the_last_one_is_refused_before_anything_loads(tiny_models):
    count = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"'cuda:{count}' does not exist: this process sees"):
        LLMEngine(tiny_models["llama"], EngineArgs(device=f"cuda:{count}", kv_cache_bytes=KV_CACHE_BYTES))


def _greedy_in_a_thread(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    """Steps on a thread of its own, as AsyncLLMEngine runs them: a new thread's current device is GPU 0."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), {"prompt_token_ids": prompt}, params)
    outputs: dict[str, list[int]] = {}

    def run() -> None:
        while engine.has_unfinished_requests():
            outputs.update({o.request_id: o.outputs[0].token_ids for o in engine.step() if o.finished})

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the engine did not finish within 120 s"
    return [outputs[str(index)] for index in range(len(prompts))]


@two_gpus
def test_an_engine_on_the_second_gpu_matches_one_on_the_first_and_leaves_gpu_0_alone(tiny_models):
    rng = random.Random(3)
    prompts = [[rng.randrange(1000) for _ in range(rng.randint(1, 200))] for _ in range(6)]
    args = {"dtype": "float32", "max_model_len": 1024, "kv_cache_bytes": KV_CACHE_BYTES}
    on_first = LLMEngine(tiny_models["llama"], EngineArgs(device="cuda:0", **args))
    expected = _greedy_in_a_thread(on_first, prompts)
    del on_first
    gc.collect()  # its tensors on GPU 0 go now, not during the measured part
    torch.cuda.set_device(0)  # as a process that never chose a device: what the engine must not rely on
    torch.cuda.synchronize(0)
    gpu0_before = torch.cuda.memory_allocated(0)

    try:
        engine = LLMEngine(tiny_models["llama"], EngineArgs(device="cuda:1", **args))
        assert engine.pool.tensor.device == torch.device("cuda", 1)
        weights = engine.runner.model.weights
        assert {t.device for t in (weights.embed_tokens, weights.lm_head, weights.layers[0].qkv)} == {torch.device("cuda", 1)}
        assert _greedy_in_a_thread(engine, prompts) == expected
        assert engine.runner.graphs.num_replays > 0, "no decode step ran through a CUDA graph on GPU 1"
        assert torch.cuda.memory_allocated(0) == gpu0_before, "the engine on GPU 1 allocated on GPU 0"
    finally:
        torch.cuda.set_device(0)  # the engine made GPU 1 current in this thread; later tests' bare "cuda" means 0


@two_gpus
@pytest.mark.parametrize(("sender_device", "receiver_device"), [("cuda:0", "cuda:1"), ("cuda:1", "cuda:0")])
def test_blocks_move_between_pools_on_two_gpus_byte_identical(tmp_path, sender_device, receiver_device):
    """The sender sits in this process (its main thread keeps GPU 0 current either way), the receiver in a
    peer process; runs of blocks and scattered ones."""
    registry = f"file://{tmp_path}"
    pool = make_pool("bfloat16", 512, device=sender_device)
    fill_random(pool, seed=4)
    engine = TransferEngine()
    engine.initialize("prefill-gpu", registry, "ucx", pool=pool_description("tiny", pool))
    receiver = PeerProcess("decode-gpu", registry, dtype="bfloat16", num_blocks=512, device=receiver_device)
    try:
        sender = KVSender(engine, pool, "tiny")
        rng = random.Random(1)
        cases = {"run": (list(range(1, 129)), list(range(200, 328))),
                 "scattered": (rng.sample(range(1, 512), 64), rng.sample(range(1, 512), 64))}  # fmt: skip
        for name, (src, dst) in cases.items():
            handle = DestinationHandle.from_json(receiver.call("expect", request_id=name, block_ids=dst)["handle"])
            assert sender.send_blocks(name, src, handle) == len(src) * pool.block_bytes()
            assert receiver.call("wait", request_id=name)["arrived"]
            assert receiver.call("digest", block_ids=dst)["digests"] == block_digests(pool, src), name
    finally:
        receiver.close()
        engine.close()
