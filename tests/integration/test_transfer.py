"""The transfer engine and KV connector between real processes over real UCX (loopback), with the
peer registry in a real redis-server."""

from __future__ import annotations

import random
import re
import time
from dataclasses import replace

import pytest
from support.block_sets import NUM_BLOCKS, fragmented
from support.peer_process import PeerProcess
from support.refused_writes import refused_around_one_accepted
from support.transfer_peer import block_digests, fill_random, make_pool

from kvferry.kvcache.compatibility import COMPATIBILITY_FIELDS
from kvferry.kvcache.kv_pool import KVPool
from kvferry.kvcache.node_registry import RedisRegistry
from kvferry.transfer import (
    LayoutMismatchError,
    PeerUnreachableError,
    TransferEngine,
    TransferError,
    TransferRejectedError,
    TransferTimeoutError,
)
from kvferry.transfer.kv_connector import (
    DestinationHandle,
    KVReceiver,
    KVSender,
    coalesce_block_runs,
    pool_description,
)

pytest_plugins = ["support.transfer_fixtures"]  # local_engine, peers


def test_coalescing_pairs_runs_contiguous_on_both_sides():
    assert coalesce_block_runs([4, 5, 6, 9, 10], [20, 21, 30, 31, 32]) == [(4, 20, 2), (6, 30, 1), (9, 31, 2)]
    assert coalesce_block_runs([], []) == []
    rng = random.Random(5)
    for _ in range(300):  # runs give back every pair in order, and no two neighbouring runs could be one
        n = rng.randrange(1, 60)
        src = [i if rng.random() < 0.8 else rng.randrange(200) for i in range(n)]
        dst = [i + 7 if rng.random() < 0.8 else rng.randrange(200) for i in range(n)]
        runs = coalesce_block_runs(src, dst)
        assert [(s + k, d + k) for s, d, count in runs for k in range(count)] == list(zip(src, dst, strict=True))
        assert not any(a[0] + a[2] == b[0] and a[1] + a[2] == b[1] for a, b in zip(runs, runs[1:], strict=False))
    with pytest.raises(ValueError, match="3 source blocks for 2"):
        coalesce_block_runs([1, 2, 3], [1, 2])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fragmented_blocks_arrive_byte_identical(dtype, redis_url, local_engine, peers, request):
    engine, pool = local_engine("prefill", dtype)
    fill_random(pool, seed=11)
    sender = KVSender(engine, pool, "tiny")
    receiver_name = f"decode-{request.node.name}"
    receiver = peers(receiver_name, redis_url, dtype=dtype)
    rng = random.Random(dtype)
    for round_index in range(3):
        src = fragmented(rng, 40)
        dst = fragmented(rng, 40)
        handle = DestinationHandle.from_json(receiver.call("expect", request_id=f"r{round_index}", block_ids=dst)["handle"])
        assert sender.send_blocks(f"r{round_index}", src, handle) == 40 * pool.block_bytes()
        assert receiver.call("wait", request_id=f"r{round_index}")["arrived"]
        assert receiver.call("digest", block_ids=dst)["digests"] == block_digests(pool, src)


def test_only_blocks_the_decode_side_lacks_travel(redis_url, local_engine, peers, request):
    engine, pool = local_engine("prefill")
    fill_random(pool, seed=3)
    sender = KVSender(engine, pool, "tiny")
    receiver = peers(f"decode-{request.node.name}", redis_url)
    prompt_blocks = [10, 11, 12, 13, 14, 15]
    # The decode side already holds the first four blocks (an earlier turn); it reserves two.
    handle = DestinationHandle.from_json(receiver.call("expect", request_id="turn2", block_ids=[40, 41], first_block=4)["handle"])
    assert sender.send_blocks("turn2", prompt_blocks, handle) == 2 * pool.block_bytes()
    assert receiver.call("wait", request_id="turn2")["arrived"]
    assert receiver.call("digest", block_ids=[40, 41])["digests"] == block_digests(pool, [14, 15])
    stats = receiver.call("stats")["stats"]
    assert stats["leases_completed"] == 1


# One change per handshake field, made to the sender's pool (its values there, the peer's defaults here).
LAYOUT_CHANGES: dict[str, tuple[str, dict[str, object]]] = {
    "model": ("another-model", {}),
    "weights": ("tiny", {"weights": "a-fine-tune"}),
    "dtype": ("tiny", {"dtype": "float16"}),
    "block_size": ("tiny", {"block_size": 32}),
    "layout": ("tiny", {"layout": "layer-major:[layer,block,kv,slot,head,dim]"}),
    "num_layers": ("tiny", {"num_layers": 3}),
    "num_kv_heads": ("tiny", {"num_kv_heads": 4}),
    "head_dim": ("tiny", {"head_dim": 64}),
}


@pytest.fixture(scope="module")
def layout_peer(redis_url):
    peer = PeerProcess("decode-layouts", redis_url)  # the defaults: tiny, float32, 16 tokens, 2 layers, 2 x 32
    yield peer
    peer.close()


@pytest.mark.parametrize("field", COMPATIBILITY_FIELDS)
def test_mismatched_pools_are_refused_naming_the_field(field, layout_peer, local_engine):
    """Every handshake field, at the handshake (the peer's registry record) and at the send (the
    decode side's handle): refused with the field and both values named, and nothing written."""
    engine, _ = local_engine("prefill")
    model, changes = LAYOUT_CHANGES[field]
    ours = replace(make_pool("float32", 8).layout, **changes)
    sender = KVSender(engine, KVPool(ours, 8), model)
    theirs = pool_description("tiny", make_pool("float32", 8))
    expected = re.escape(f"'decode-layouts' and this node differ in {field}: {theirs[field]!r} there, {sender.description[field]!r} here")
    with pytest.raises(LayoutMismatchError, match=expected):
        sender.handshake("decode-layouts")
    handle = DestinationHandle.from_json(layout_peer.call("expect", request_id=field, block_ids=[1])["handle"])
    with pytest.raises(LayoutMismatchError, match=expected):
        sender.send_blocks(field, [1], handle)
    stats = layout_peer.call("stats")["stats"]
    assert stats["writes_received"] == stats["rejected_writes"] == 0


def test_receiver_that_stops_answering_fails_the_send_within_the_timeout(redis_url, local_engine, peers, request):
    engine, pool = local_engine("prefill", timeout_seconds=2.0)
    sender = KVSender(engine, pool, "tiny")
    receiver = peers(f"decode-{request.node.name}", redis_url)
    handle = DestinationHandle.from_json(receiver.call("expect", request_id="r", block_ids=list(range(1, 200)))["handle"])
    receiver.pause()  # alive but silent: no ready, no done
    started = time.monotonic()
    with pytest.raises(TransferTimeoutError):
        sender.send_blocks("r", list(range(1, 200)), handle)
    assert time.monotonic() - started < 3.0
    receiver.kill()


def test_receiver_killed_mid_transfer_fails_fast_and_a_restarted_peer_works(redis_url, local_engine, peers, request):
    engine, pool = local_engine("prefill", timeout_seconds=2.0)
    fill_random(pool, seed=5)
    sender = KVSender(engine, pool, "tiny")
    name = f"decode-{request.node.name}"
    receiver = peers(name, redis_url)
    handle = DestinationHandle.from_json(receiver.call("expect", request_id="r", block_ids=list(range(1, 250)))["handle"])
    future = engine.batch_transfer_write_async(
        name, [pool.tensor.data_ptr()] * 64, [handle.base_address + pool.block_bytes()] * 64, [pool.block_bytes()] * 64, token=handle.token
    )
    receiver.kill()
    started = time.monotonic()
    with pytest.raises(TransferError):
        future.result(timeout=5)
    assert time.monotonic() - started < 3.0

    restarted = peers(name, redis_url)  # same name, new worker address in the registry
    new_handle = DestinationHandle.from_json(restarted.call("expect", request_id="again", block_ids=[7, 8])["handle"])
    sender.send_blocks("again", [3, 4], new_handle)
    assert restarted.call("wait", request_id="again")["arrived"]
    assert restarted.call("digest", block_ids=[7, 8])["digests"] == block_digests(pool, [3, 4])


def test_sender_killed_lets_the_lease_expire_and_frees_the_blocks(redis_url, local_engine, peers, request):
    engine, pool = local_engine("decode")
    expired: list[tuple[str, list[int]]] = []
    receiver = KVReceiver(engine, pool, "tiny", lease_seconds=1.0, on_expired=lambda rid, blocks: expired.append((rid, blocks)))
    sender = peers(f"prefill-{request.node.name}", redis_url)
    started = time.monotonic()
    handle = receiver.expect("r", [5, 6, 7])
    sender.kill()  # dies before it sends anything
    assert receiver.wait(handle) is False
    assert 0.95 < time.monotonic() - started < 2.0
    assert expired == [("r", [5, 6, 7])]
    # A write that arrives for the expired lease is refused.
    assert receiver._guard(handle.token, [(handle.base_address + 5 * pool.block_bytes(), pool.block_bytes())]) is not None


def test_handshake_to_a_closed_peer_fails_fast(redis_url, local_engine, peers, request):
    engine, pool = local_engine("prefill", handshake_timeout_seconds=1.0)
    name = f"decode-{request.node.name}"
    receiver = peers(name, redis_url)
    engine.handshake(name)  # alive: answers
    receiver.kill()  # its registry record stays behind, stale
    started = time.monotonic()
    with pytest.raises((TransferTimeoutError, PeerUnreachableError)):
        engine.handshake(name)
    assert time.monotonic() - started < 1.5
    with pytest.raises(PeerUnreachableError, match="not in the registry"):
        engine.handshake("nobody-by-this-name")


def test_a_known_peer_whose_record_vanished_keeps_its_last_address(redis_url, local_engine, peers, request):
    """Redis restarted empty (a Redis pod replaced): until the peer's next heartbeat writes its record again
    (5 s), a sender that knew it goes on with its last address instead of failing the transfer, even after
    a timed-out operation dropped its endpoint (on a loaded node, some writes time out)."""
    engine, _ = local_engine("prefill", handshake_timeout_seconds=1.0)
    name = f"decode-{request.node.name}"
    registry = RedisRegistry(redis_url)
    receiver = peers(name, redis_url)
    engine.handshake(name)
    registry.remove(name)
    engine.handshake(name)  # on its open endpoint
    receiver.pause()
    with pytest.raises(TransferTimeoutError):  # the endpoint is dropped ...
        engine.handshake(name)
    receiver.resume()
    registry.remove(name)
    engine.handshake(name)  # ... and a new one connects to the address it had
    with pytest.raises(PeerUnreachableError, match="not in the registry"):  # one it never knew: no address
        engine.handshake("nobody-by-this-name")


def test_a_send_reaches_its_receiver_by_the_handle_without_the_registry(redis_url, local_engine, peers, request):
    """The handle carries the receiver's worker address: the write makes no registry lookup, so it goes
    through with the receiver's record gone (and a sender that never knew the receiver)."""
    engine, pool = local_engine("prefill")
    fill_random(pool, seed=8)
    sender = KVSender(engine, pool, "tiny")
    name = f"decode-{request.node.name}"
    receiver = peers(name, redis_url)
    handle = DestinationHandle.from_json(receiver.call("expect", request_id="r", block_ids=[9, 10])["handle"])
    RedisRegistry(redis_url).remove(name)  # by name alone it is unknown now (until its next heartbeat)
    assert sender.send_blocks("r", [2, 3], handle) == 2 * pool.block_bytes()
    assert receiver.call("wait", request_id="r")["arrived"]
    assert receiver.call("digest", block_ids=[9, 10])["digests"] == block_digests(pool, [2, 3])


def test_writes_outside_a_lease_or_with_a_stale_token_are_refused(redis_url, local_engine, peers, request):
    engine, pool = local_engine("prefill")
    fill_random(pool, seed=4)
    sender = KVSender(engine, pool, "tiny")
    receiver = peers(f"decode-{request.node.name}", redis_url)
    refused_around_one_accepted(sender, receiver, "r", [1, 2], [20, 21])
    assert receiver.call("stats")["stats"]["rejected_writes"] == 3
    assert receiver.call("digest", block_ids=[20, 21])["digests"] == block_digests(pool, [1, 2])


def test_malformed_and_duplicate_control_messages_do_no_harm(redis_url, local_engine, peers, request):
    from kvferry.transfer import protocol
    from kvferry.transfer.ucx import UcxWorker

    engine, pool = local_engine("prefill")
    name = f"decode-{request.node.name}"
    receiver = peers(name, redis_url)
    raw = UcxWorker()
    endpoint = raw.connect(bytes.fromhex(str(engine.registry.lookup(name)["address"])))
    # ... and a write whole but for an optional field of the wrong type.
    mistyped = protocol.encode("write", sender="x", address="00", op=1, tag_base=0, ranges="", token=None, iov=False,
                               timeout=1.0, eager=1)  # fmt: skip
    garbage = [b"\x00\x00", b"\xff\xff\xff\x00{", protocol.encode("write", sender="x"), b"\x05\x00\x00\x00[1,2]", mistyped]
    requests = [UcxWorker.send(endpoint, message, protocol.CONTROL_TAG) for message in garbage]
    # A reply that matches no operation of the receiver (a duplicate or forged write_done).
    requests.append(UcxWorker.send(endpoint, protocol.encode("write_done", sender="x", op=12345), protocol.CONTROL_TAG))
    deadline = time.monotonic() + 5
    while not all(r.completed for r in requests) and time.monotonic() < deadline:
        raw.progress()
    time.sleep(0.3)
    stats = receiver.call("stats")["stats"]
    assert stats["malformed_messages"] == 5
    assert stats["duplicate_messages"] == 1
    sender = KVSender(engine, pool, "tiny")  # and the peer still works
    handle = DestinationHandle.from_json(receiver.call("expect", request_id="after", block_ids=[9])["handle"])
    sender.send_blocks("after", [9], handle)
    assert receiver.call("wait", request_id="after")["arrived"]


def test_file_registry_connects_processes_without_redis(tmp_path, local_engine, peers, request):
    registry = f"file://{tmp_path}"
    pool = make_pool("float32", NUM_BLOCKS)
    fill_random(pool, seed=8)
    engine = TransferEngine()
    engine.initialize(f"prefill-{request.node.name}", registry, "ucx", pool=pool_description("tiny", pool))
    try:
        receiver = peers(f"decode-{request.node.name}", registry)
        handle = DestinationHandle.from_json(receiver.call("expect", request_id="f", block_ids=[3, 4, 9])["handle"])
        KVSender(engine, pool, "tiny").send_blocks("f", [1, 2, 3], handle)
        assert receiver.call("digest", block_ids=[3, 4, 9])["digests"] == block_digests(pool, [1, 2, 3])
    finally:
        engine.close()


def test_batch_read_pulls_remote_ranges_into_local_memory(redis_url, local_engine, peers, request):
    engine, pool = local_engine("decode")
    name = f"prefill-{request.node.name}"
    remote = peers(name, redis_url)
    remote.call("fill", seed=21)
    base = DestinationHandle.from_json(remote.call("expect", request_id="any", block_ids=[1])["handle"]).base_address
    block = pool.block_bytes()
    remote_blocks, local_blocks = [30, 31, 7, 100], [5, 6, 60, 61]
    engine.register_memory(pool.tensor.data_ptr(), pool.tensor.numel() * pool.tensor.element_size())
    assert engine.batch_transfer_read(
        name, [pool.tensor.data_ptr() + b * block for b in local_blocks], [base + b * block for b in remote_blocks], [block] * 4
    ) == 0
    assert block_digests(pool, local_blocks) == remote.call("digest", block_ids=remote_blocks)["digests"]
    with pytest.raises(TransferRejectedError, match="not registered"):
        engine.batch_transfer_read(name, [pool.tensor.data_ptr()], [16], [block])
    assert remote.call("stats")["stats"]["rejected_reads"] == 1


def test_thousands_of_fragmented_puts_arrive_byte_identical(redis_url, local_engine, peers, request):
    """Host-to-host writes travel as one batch of RMA puts (UCX copies many per progress call): pieces of
    blocks cut at unaligned offsets, half of them shuffled and half in order (merged into single puts),
    and a run longer than UCX's 512 KiB CMA segment all land byte-identical."""
    engine, pool = local_engine("prefill")
    fill_random(pool, seed=5)
    engine.register_memory(pool.tensor.data_ptr(), pool.tensor.numel() * pool.tensor.element_size())
    name = f"decode-{request.node.name}"
    receiver = peers(name, redis_url)
    rng = random.Random(17)
    block = pool.block_bytes()
    long_run = 40  # blocks 100..139 from 10..49: 640 KiB with 16 KiB blocks
    dst_blocks = list(range(100, 100 + long_run)) + rng.sample([b for b in range(1, NUM_BLOCKS) if not 100 <= b < 140], 60)
    src_blocks = list(range(10, 10 + long_run)) + rng.sample(range(NUM_BLOCKS), 60)
    handle = DestinationHandle.from_json(receiver.call("expect", request_id="puts", block_ids=dst_blocks)["handle"])
    src_base, dst_base = pool.tensor.data_ptr(), handle.base_address
    pieces = [(src_base + 10 * block, dst_base + 100 * block, long_run * block)]
    for s, d in zip(src_blocks[long_run:], dst_blocks[long_run:], strict=True):
        cuts = sorted(rng.sample(range(1, block), rng.randint(0, 40)))
        block_pieces = [(src_base + s * block + a, dst_base + d * block + a, b - a) for a, b in zip([0, *cuts], [*cuts, block], strict=True)]
        if rng.random() < 0.5:
            rng.shuffle(block_pieces)
        pieces.extend(block_pieces)
    assert len(pieces) > 500
    src, dst, lengths = (list(column) for column in zip(*pieces, strict=True))
    assert engine.batch_transfer_write(name, src, dst, lengths, token=handle.token) == 0
    assert receiver.call("digest", block_ids=dst_blocks)["digests"] == block_digests(pool, src_blocks)
