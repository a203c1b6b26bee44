"""Transfer faults injected between real processes over real UCX (issue [7], scenario 6): UCX completion
failures k times, a peer that stops answering mid-transfer. The faults come from
tests/support/faulty_transfer.py, a real transfer peer with one fault patched in; everything else is the
engine's real code. Layout mismatches: tests/integration/test_transfer.py."""

from __future__ import annotations

import random
import time

import pytest
from support.block_sets import fragmented
from support.transfer_peer import block_digests, fill_random

from kvferry.transfer import TransferTimeoutError
from kvferry.transfer.kv_connector import DestinationHandle, KVReceiver, KVSender, coalesce_block_runs

pytest_plugins = ["support.transfer_fixtures"]  # local_engine, peers

FAULTY = "support.faulty_transfer"
MAX_RETRIES = 2  # TransferConfig's default, which the peers run with
BLOCKS = 40


def puts_issued(ranges: int, fault: str, failing_rounds: int) -> int:
    """Puts the sender issues when each failing round fails the second half of its puts (fail_puts) or
    its flush (fail_flushes), and every retry sends again only what did not land."""
    total, pending = 0, ranges
    for _ in range(failing_rounds):
        total += pending
        pending = max(1, pending // 2) if fault == "fail_puts" else pending
    return total + pending


class Receiver:
    """The decode side in this process: a KV receiver whose ended leases are recorded."""

    def __init__(self, engine, pool, lease_seconds: float) -> None:
        self.engine, self.pool = engine, pool
        self.expired: list[tuple[str, list[int]]] = []
        self.kv = KVReceiver(engine, pool, "tiny", lease_seconds, on_expired=lambda rid, blocks: self.expired.append((rid, blocks)))


@pytest.mark.parametrize(("fault", "failing_rounds"), [("fail_puts", 1), ("fail_puts", MAX_RETRIES), ("fail_flushes", MAX_RETRIES)])
def test_completion_failures_within_the_bound_are_retried_and_delivered_once(fault, failing_rounds, redis_url, local_engine, peers, request):
    engine, pool = local_engine("decode")
    receiver = Receiver(engine, pool, lease_seconds=5.0)
    sender = peers(f"prefill-{request.node.name}", redis_url, module=FAULTY, **{fault: failing_rounds})
    sender.call("fill", seed=31)
    rng = random.Random(fault + str(failing_rounds))
    src, dst = fragmented(rng, BLOCKS), fragmented(rng, BLOCKS)
    handle = receiver.kv.expect("r", dst)

    reply = sender.call("send", handle=handle.to_json(), src_block_ids=src)

    block_bytes = BLOCKS * pool.block_bytes()
    assert reply == {"ok": True, "bytes": block_bytes}
    assert receiver.kv.wait(handle, timeout=5)
    assert block_digests(pool, dst) == sender.call("digest", block_ids=src)["digests"]
    sent = sender.call("stats")["stats"]
    assert sent["put_retries"] == failing_rounds
    assert sent["puts"] == puts_issued(len(coalesce_block_runs(src, dst)), fault, failing_rounds)
    assert sent["bytes_sent"] == block_bytes  # counted once per write, not per attempt
    assert sent["in_flight"] == 0
    # Delivered once: one write recorded, one lease completed, no message seen twice.
    assert engine.stats["writes_received"] == 1 and engine.stats["bytes_received"] == block_bytes
    assert engine.stats["duplicate_messages"] == engine.stats["aborted_writes"] == 0
    assert receiver.kv.stats["leases_completed"] == 1 and receiver.expired == []
    assert receiver.kv.claim(handle) and receiver.kv.open_leases() == 0


def test_completion_failures_beyond_the_bound_fail_naming_the_peer_and_free_both_sides(redis_url, local_engine, peers, request):
    engine, pool = local_engine("decode")
    receiver = Receiver(engine, pool, lease_seconds=5.0)
    name = f"prefill-{request.node.name}"
    sender = peers(name, redis_url, module=FAULTY, fail_puts=100)  # every round fails
    handle = receiver.kv.expect("r", list(range(10, 30)))
    started = time.monotonic()

    reply = sender.call("send", handle=handle.to_json(), src_block_ids=list(range(50, 70)))

    assert time.monotonic() - started < 2.0  # well inside the 2 s transfer timeout: no waiting it out
    assert reply["ok"] is False and reply["error"] == "TransferRetriesExhaustedError"
    assert f"write to {engine.local_name!r} failed after {MAX_RETRIES + 1} attempts" in reply["message"]
    assert "Connection reset by remote peer" in reply["message"]  # UCX's own words for the error
    sent = sender.call("stats")["stats"]
    assert sent["put_retries"] == MAX_RETRIES and sent["bytes_sent"] == 0 and sent["in_flight"] == 0
    # The sender told the receiver it gave up: the lease ends now, not at its deadline, and its
    # blocks are reported for freeing; nothing was recorded as delivered.
    assert receiver.kv.wait(handle, timeout=2) is False
    assert time.monotonic() - started < 2.5
    assert receiver.expired == [("r", list(range(10, 30)))]
    assert engine.stats["aborted_writes"] == 1 and engine.stats["writes_received"] == 0
    assert receiver.kv.open_leases() == 0 and engine.in_flight() == 0


def test_receiver_that_stops_mid_transfer_fails_the_send_in_time_and_recovers_when_resumed(redis_url, local_engine, peers, request):
    engine, pool = local_engine("prefill", timeout_seconds=1.0)
    fill_random(pool, seed=9)
    sender = KVSender(engine, pool, "tiny")
    name = f"decode-{request.node.name}"
    receiver = peers(name, redis_url, module=FAULTY, stop_after_ready=1, lease=6.0)
    handle = DestinationHandle.from_json(receiver.call("expect", request_id="r", block_ids=list(range(1, 100)))["handle"])
    started = time.monotonic()

    with pytest.raises(TransferTimeoutError, match=f"write with {name} did not finish in time"):
        sender.send_blocks("r", list(range(100, 199)), handle)  # the receiver stops after write_ready

    assert 1.0 <= time.monotonic() - started < 2.0
    assert engine.in_flight() == 0  # nothing held for the stopped peer
    time.sleep(0.5)
    receiver.resume()
    # Resumed, it holds the write no longer than the sender waited (and hears that it was abandoned):
    # the lease ends at once, long before its 6 s, and nothing counts as delivered.
    waited = receiver.call("wait", request_id="r", timeout=5)
    assert waited["arrived"] is False and waited["expired"] == ["r"]
    assert time.monotonic() - started < 4.0
    stats = receiver.call("stats")["stats"]
    assert stats["writes_received"] == 0 and stats["in_flight"] == 0
    # And it works again.
    again = DestinationHandle.from_json(receiver.call("expect", request_id="again", block_ids=[5, 6])["handle"])
    sender.send_blocks("again", [7, 8], again)
    assert receiver.call("wait", request_id="again")["arrived"]
    assert receiver.call("digest", block_ids=[5, 6])["digests"] == block_digests(pool, [7, 8])


def test_a_receiver_killed_after_accepting_a_write_leaves_the_sender_working(redis_url, local_engine, peers, request):
    """Every put of the write has landed and the writer waits for the receiver's done when the receiver dies
    (SIGKILL; its registry record stays behind): at the deadline the sender tells the dead peer it gave up,
    over a new endpoint to an address nobody owns. That connect fails (UCX cannot attach to the dead
    process's shared memory); it must fail as a transfer error, not end the engine's loop thread, which
    would leave every later transfer of the node waiting. (Stopped at the ready instead, under load the
    kill could come before the puts and fail them, a path without the abort.)"""
    engine, pool = local_engine("prefill", timeout_seconds=1.0)
    fill_random(pool, seed=11)
    KVSender(engine, pool, "tiny")  # registers the pool's memory with the engine
    name = f"decode-{request.node.name}"
    receiver = peers(name, redis_url, module=FAULTY, stop_at_complete=1)
    handle = DestinationHandle.from_json(receiver.call("expect", request_id="r", block_ids=list(range(1, 60)))["handle"])
    write = engine.batch_transfer_write_async(name, [pool.tensor.data_ptr()], [handle.base_address + pool.block_bytes()],
                                              [pool.block_bytes()], token=handle.token)
    assert receiver.wait_stopped(5), "the receiver did not stop at the write's complete"
    receiver.kill()
    with pytest.raises(TransferTimeoutError):
        write.result(timeout=5)

    other = peers(f"decode-other-{request.node.name}", redis_url)
    again = DestinationHandle.from_json(other.call("expect", request_id="again", block_ids=[5, 6])["handle"])
    sent = engine.batch_transfer_write_async(other.name, [pool.tensor.data_ptr() + 7 * pool.block_bytes()],
                                             [again.base_address + 5 * pool.block_bytes()], [2 * pool.block_bytes()],
                                             token=again.token)
    assert sent.result(timeout=5) == 0, "the engine's loop no longer turns"
    assert other.call("wait", request_id="again")["arrived"]
    assert other.call("digest", block_ids=[5, 6])["digests"] == block_digests(pool, [7, 8])
