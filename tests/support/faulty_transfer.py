"""A real transfer peer (support.transfer_peer) with one transfer fault patched in, for fault tests only.

    python -m support.faulty_transfer --fail-puts K --name ... (the usual transfer_peer flags)

--fail-puts K: in each of the first K rounds of puts, UCX answers the second half of the round (at least
one put) with the error pointer it returns for a put on a broken connection (UCS_ERR_CONNECTION_RESET).
Those puts are not issued, so their bytes are really missing until a retry sends them.
--fail-flushes K: the first K flushes after a round of puts complete with UCS_ERR_ENDPOINT_TIMEOUT (the
puts were issued and may have landed, but a failed flush confirms none of them).
--stop-after-ready N: the N-th write this peer accepts, it answers with write_ready and then stops itself
(SIGSTOP) before it can acknowledge: a peer that stops answering mid-transfer. SIGCONT resumes it.
--stop-at-complete N: the N-th write_complete that reaches this peer (every put of that write has landed),
it stops itself before handling it: the writer waits for a write_done that does not come.
Everything else is the engine's real code over real UCX.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence

from support import transfer_peer

from kvferry.transfer import ucp_direct
from kvferry.transfer.engine import TransferEngine
from kvferry.transfer.protocol import ControlMessage

# UCX's status codes (ucs/type/status.h), as UCX itself reports these failures.
UCS_ERR_CONNECTION_RESET = -25
UCS_ERR_ENDPOINT_TIMEOUT = -80


def fail_puts(rounds: int) -> None:
    original = ucp_direct.put_many
    left = [rounds]

    def put_many(endpoint: int, addresses: Sequence[int], lengths: Sequence[int], remote: Sequence[int], rkeys: Sequence[int]) -> ucp_direct.PutBatch:
        if left[0] == 0:
            return original(endpoint, addresses, lengths, remote, rkeys)
        left[0] -= 1
        keep = len(lengths) - max(1, len(lengths) // 2)
        issued = original(endpoint, addresses[:keep], lengths[:keep], remote[:keep], rkeys[:keep])
        assert not issued.failed, "a real put failed under the injected fault"
        return ucp_direct.PutBatch(len(lengths), list(range(keep, len(lengths))), UCS_ERR_CONNECTION_RESET)

    ucp_direct.put_many = put_many  # type: ignore[assignment]


class _FailingFlush(ucp_direct.UcpRequest):
    """A real flush, reported as failed once it completed."""

    def __init__(self, real: ucp_direct.UcpRequest) -> None:
        super().__init__(None, None, 0)
        self._real = real

    @property
    def completed(self) -> bool:
        if not self._real.completed:
            return False
        self.status = UCS_ERR_ENDPOINT_TIMEOUT
        return True


def fail_flushes(count: int) -> None:
    original = ucp_direct.flush
    left = [count]

    def flush(endpoint: int, worker: int) -> ucp_direct.UcpRequest:
        if left[0] == 0:
            return original(endpoint, worker)
        left[0] -= 1
        return _FailingFlush(original(endpoint, worker))

    ucp_direct.flush = flush  # type: ignore[assignment]


def stop_after_ready(nth: int) -> None:
    original = TransferEngine._dispatch
    left = [nth]

    def dispatch(self: TransferEngine, message: ControlMessage) -> None:
        before = self.in_flight()
        original(self, message)
        if message.kind != "write" or self.in_flight() == before:  # not a write it accepted
            return
        left[0] -= 1
        if left[0] == 0:
            until = time.monotonic() + 0.05
            while time.monotonic() < until:  # let write_ready leave before the process stops
                self.worker.progress()
            os.kill(os.getpid(), signal.SIGSTOP)
            # The stop reaches every thread at its next trip into the kernel, this one included: without
            # this sleep it ran on long enough to handle write_complete and acknowledge (seen under load).
            time.sleep(0.1)

    TransferEngine._dispatch = dispatch  # type: ignore[method-assign]


def stop_at_complete(nth: int) -> None:
    original = TransferEngine._dispatch
    left = [nth]

    def dispatch(self: TransferEngine, message: ControlMessage) -> None:
        if message.kind == "write_complete":
            left[0] -= 1
            if left[0] == 0:  # every put has landed; stopped before it can acknowledge
                os.kill(os.getpid(), signal.SIGSTOP)
                time.sleep(0.1)  # (as in stop_after_ready: the stop reaches this thread at its next syscall)
        original(self, message)

    TransferEngine._dispatch = dispatch  # type: ignore[method-assign]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-puts", type=int, default=0)
    parser.add_argument("--fail-flushes", type=int, default=0)
    parser.add_argument("--stop-after-ready", type=int, default=0)
    parser.add_argument("--stop-at-complete", type=int, default=0)
    options, peer_argv = parser.parse_known_args()
    fail_puts(options.fail_puts)
    fail_flushes(options.fail_flushes)
    stop_after_ready(options.stop_after_ready)
    stop_at_complete(options.stop_at_complete)
    sys.argv = [sys.argv[0], *peer_argv]
    transfer_peer.main()
