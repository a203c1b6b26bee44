"""Prepared writes (TransferEngine.prepare_write, KVSender.prepare): requested before the data exists, sent
later, between real processes over real UCX, with the registry in a real redis-server."""

from __future__ import annotations

import time

import pytest
from support.transfer_peer import block_digests, fill_random

from kvferry.transfer import TransferRejectedError, TransferTimeoutError
from kvferry.transfer.kv_connector import DestinationHandle, KVSender

pytest_plugins = ["support.transfer_fixtures"]  # local_engine, peers


def _setup(redis_url, local_engine, peers, request, seed: int):
    engine, pool = local_engine("prefill")
    fill_random(pool, seed=seed)
    return engine, pool, KVSender(engine, pool, "tiny"), peers(f"decode-{request.node.name}", redis_url)


def test_a_prepared_write_sent_after_a_pause_lands_once(redis_url, local_engine, peers, request):
    """The write is requested first and its data sent later, as a prefill node does around the prefill."""
    engine, pool, sender, receiver = _setup(redis_url, local_engine, peers, request, seed=21)
    dst = [30, 31, 32, 40, 41]  # two destination runs
    handle = DestinationHandle.from_json(receiver.call("expect", request_id="p", block_ids=dst)["handle"])
    prepared = sender.prepare(handle)
    assert prepared is not None and prepared.ranges == 2
    time.sleep(0.3)  # the prefill computing
    src = [5, 6, 7, 12, 13]  # contiguous within each destination run
    assert sender.send_blocks("p", src, handle, prepared) == 5 * pool.block_bytes()
    assert receiver.call("wait", request_id="p")["arrived"]
    assert receiver.call("digest", block_ids=dst)["digests"] == block_digests(pool, src)
    stats = receiver.call("stats")["stats"]
    assert (stats["writes_received"], stats["withdrawn_writes"], stats["duplicate_messages"]) == (1, 0, 0)
    assert engine.in_flight() == 0 and stats["in_flight"] == 0


def _accepted(prepared) -> None:
    """Until the target's answer arrived (a prefill takes longer than that round trip)."""
    deadline = time.monotonic() + 5
    while prepared.puts is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert prepared.puts is not None


def test_a_source_that_splits_a_prepared_run_goes_as_puts_into_it(redis_url, local_engine, peers, request):
    """Prefix-cache blocks make the source fragmented where the destination is one run: into host memory the
    write goes as puts, which land anywhere in the ranges prepared, so it is sent as prepared all the same."""
    engine, pool, sender, receiver = _setup(redis_url, local_engine, peers, request, seed=22)
    dst = [50, 51, 52, 53]
    handle = DestinationHandle.from_json(receiver.call("expect", request_id="w", block_ids=dst)["handle"])
    prepared = sender.prepare(handle)
    _accepted(prepared)
    assert prepared.puts and prepared.ranges == 1
    src = [3, 9, 10, 2]
    assert sender.send_blocks("w", src, handle, prepared) == 4 * pool.block_bytes()
    assert prepared.outcome == "sent"
    assert receiver.call("wait", request_id="w")["arrived"]
    assert receiver.call("digest", block_ids=dst)["digests"] == block_digests(pool, src)
    stats = receiver.call("stats")["stats"]
    assert (stats["writes_received"], stats["withdrawn_writes"], stats["leases_completed"]) == (1, 0, 1)
    assert engine.in_flight() == 0 and stats["in_flight"] == 0


def test_a_withdrawn_write_leaves_its_lease_open_for_an_ordinary_one(redis_url, local_engine, peers, request):
    engine, pool, sender, receiver = _setup(redis_url, local_engine, peers, request, seed=26)
    dst = [54, 55]
    handle = DestinationHandle.from_json(receiver.call("expect", request_id="o", block_ids=dst)["handle"])
    prepared = sender.prepare(handle)
    _accepted(prepared)
    prepared.withdraw()
    assert sender.send_blocks("o", [5, 6], handle) == 2 * pool.block_bytes()
    assert prepared.future.cancelled()  # by the loop, which took the withdrawal before the write
    assert receiver.call("wait", request_id="o")["arrived"]
    assert receiver.call("digest", block_ids=dst)["digests"] == block_digests(pool, [5, 6])
    stats = receiver.call("stats")["stats"]
    assert (stats["writes_received"], stats["withdrawn_writes"], stats["leases_completed"]) == (1, 1, 1)
    assert engine.in_flight() == 0 and stats["in_flight"] == 0


def test_ranges_that_do_not_cover_the_prepared_ones_exactly_are_refused(redis_url, local_engine, peers, request):
    """The target completes a write over the ranges it accepted, so other ranges must tile them: a block
    missing, or one written twice, is refused before any put, and nothing lands."""
    engine, pool, _, receiver = _setup(redis_url, local_engine, peers, request, seed=27)
    block, base = pool.block_bytes(), pool.tensor.data_ptr()
    before = receiver.call("digest", block_ids=[90, 91])["digests"]
    for dst_blocks in ([90], [90, 90, 91]):
        handle = DestinationHandle.from_json(receiver.call("expect", request_id=f"t{len(dst_blocks)}", block_ids=[90, 91])["handle"])
        prepared = engine.prepare_write(handle.node, [handle.base_address + 90 * block], [2 * block], token=handle.token)
        with pytest.raises(ValueError, match="takes puts"):
            prepared.send([base], [handle.base_address + 90 * block], [2 * block])  # not known to take puts yet
        _accepted(prepared)
        src = [base + i * block for i in range(len(dst_blocks))]
        future = prepared.send(src, [handle.base_address + b * block for b in dst_blocks], [block] * len(dst_blocks))
        with pytest.raises(TransferRejectedError, match="cover the ranges prepared exactly|overlap"):
            future.result(timeout=3)
    assert receiver.call("digest", block_ids=[90, 91])["digests"] == before
    assert engine.in_flight() == 0


def test_a_prepared_write_with_a_forged_token_is_refused_and_writes_nothing(redis_url, local_engine, peers, request):
    _, pool, sender, receiver = _setup(redis_url, local_engine, peers, request, seed=23)
    before = receiver.call("digest", block_ids=[60, 61])["digests"]
    handle = DestinationHandle.from_json(receiver.call("expect", request_id="f", block_ids=[60, 61])["handle"])
    forged = DestinationHandle.from_json({**handle.to_json(), "token": "0" * 32})
    prepared = sender.prepare(forged)
    with pytest.raises(TransferRejectedError, match="lease token"):
        sender.send_blocks("f", [1, 2], forged, prepared)
    assert receiver.call("digest", block_ids=[60, 61])["digests"] == before
    assert receiver.call("stats")["stats"]["rejected_writes"] == 1


def test_a_prepared_write_whose_data_never_comes_ends_the_lease_at_its_hold(redis_url, local_engine, peers, request):
    """The writer gives up when its hold passes and tells the target, whose lease ends then, not at its own
    deadline (5 s): the decode side frees the blocks at once."""
    engine, pool, _, receiver = _setup(redis_url, local_engine, peers, request, seed=24)
    handle = DestinationHandle.from_json(receiver.call("expect", request_id="h", block_ids=[70])["handle"])
    prepared = engine.prepare_write(handle.node, [handle.base_address + 70 * pool.block_bytes()], [pool.block_bytes()],
                                    token=handle.token, hold_seconds=0.5)  # fmt: skip
    with pytest.raises(TransferTimeoutError):
        prepared.future.result(timeout=3)
    started = time.monotonic()
    reply = receiver.call("wait", request_id="h")
    assert not reply["arrived"] and reply["expired"] == ["h"]
    assert time.monotonic() - started < 2  # ended by the abort, well before the lease's 5 s
    prepared.withdraw()  # a caller's clean-up after the failure does no harm ...
    with pytest.raises(RuntimeError, match="once"):
        prepared.send([pool.tensor.data_ptr()])  # ... and the handle is used once
    assert engine.in_flight() == 0


def test_a_prepared_write_takes_a_source_in_the_memory_it_was_prepared_for(redis_url, local_engine, peers, request):
    engine, pool, _, receiver = _setup(redis_url, local_engine, peers, request, seed=25)
    handle = DestinationHandle.from_json(receiver.call("expect", request_id="d", block_ids=[80])["handle"])
    block = pool.block_bytes()
    prepared = engine.prepare_write(handle.node, [handle.base_address + 80 * block], [block], token=handle.token,
                                    source_on_device=True)  # fmt: skip
    with pytest.raises(ValueError, match="1 ranges prepared"):
        prepared.send([pool.tensor.data_ptr(), pool.tensor.data_ptr() + block])
    with pytest.raises(TransferRejectedError, match="memory .host or device. the write was prepared for"):
        prepared.send([pool.tensor.data_ptr()]).result(timeout=3)
    assert engine.in_flight() == 0


def test_a_send_refused_before_any_byte_withdraws_its_prepared_write(redis_url, local_engine, peers, request):
    """A prefill whose blocks do not match the reservation: the send fails at once, and its prepared write
    ends then on both sides rather than holding the decode side until the lease ends."""
    engine, pool, sender, receiver = _setup(redis_url, local_engine, peers, request, seed=28)
    handle = DestinationHandle.from_json(receiver.call("expect", request_id="m", block_ids=[95, 96])["handle"])
    prepared = sender.prepare(handle)
    with pytest.raises(ValueError, match="3 source blocks for 2"):
        sender.send_blocks("m", [1, 2, 3], handle, prepared)
    assert prepared.outcome == "withdrawn"
    deadline = time.monotonic() + 3
    while (stats := receiver.call("stats")["stats"])["withdrawn_writes"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stats["withdrawn_writes"] == 1 and stats["in_flight"] == 0
    assert engine.in_flight() == 0
