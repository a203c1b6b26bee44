"""A host write's data: rounds of one-sided puts straight into the target's memory, each closed by a flush,
and the rounds that put again what did not land.

A put is a CMA process_vm_writev on one host (a plain copy into a peer's shared memory attached here),
RDMA WRITE across hosts; the target's CPU takes no part. Every range is a put, small ones too: with UCX
draining many CMA segments per progress call, a 16 KiB put costs a few microseconds, a third of the CPU
of the scatter-gather messages small ranges took before. The per-range work is vectorised: a batch of
64 KiB blocks holds 1024 ranges, of 16 KiB 4096.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvferry.transfer import ucp_direct
from kvferry.transfer.errors import TransferError, TransferRetriesExhaustedError
from kvferry.transfer.operation import Operation
from kvferry.transfer.peers import Peers
from kvferry.transfer.ucx import UcxWorker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoundEnd:
    failed: list[int]  # indices into the batch of the ranges that did not land
    issued: int  # ranges the round put
    status: int  # UCX's status for those that failed


class Puts:
    def __init__(self, worker: UcxWorker, peers: Peers, stats: dict[str, int], max_retries: int) -> None:
        self._worker = worker
        self._peers = peers
        self._stats = stats
        self._max_retries = max_retries

    def start(self, op: Operation, endpoint: Any, rkeys: list[list[Any]]) -> None:
        """The first round: every range of the batch, into the regions whose remote keys the target sent."""
        op.data.update(rkeys=rkeys, attempts=1)
        self._put(op, endpoint, range(len(op.data["lengths"])))

    @staticmethod
    def round_ended(op: Operation, error: BaseException | None) -> bool:
        """The flush of the round completed (an error of the operation at the flush is the flush's own)."""
        flush = op.data.get("flush")
        return flush is not None and flush.completed and (error is None or op.requests[op.checked] is flush)

    @staticmethod
    def end_round(op: Operation) -> RoundEnd:
        """What the round that just ended left out: UCX answered a put with an error, or the flush failed,
        which confirms none of them."""
        flush, batch, pending = op.data.pop("flush"), op.data.pop("batch"), op.data.pop("pending")
        if flush.status != ucp_direct.UCS_OK:
            op.requests.remove(flush)  # handled here, not an error of the operation for scan()
            return RoundEnd(list(pending), len(pending), flush.status)
        return RoundEnd([pending[i] for i in batch.failed], len(pending), batch.status)

    def retry(self, op: Operation, ended: RoundEnd) -> TransferError | None:
        """Put what did not land again on a new endpoint (a failed put leaves its endpoint failed), up to
        max_retries times within the write's deadline. None once the round is on its way; else the error
        the write fails with: retries exhausted (naming the peer and the attempts), or the peer gone."""
        attempts = op.data["attempts"]
        reason = f"{len(ended.failed)} of {ended.issued} ranges did not land ({ucp_direct.status_string(ended.status)})"
        self._peers.drop(op.peer)
        if attempts > self._max_retries:
            return TransferRetriesExhaustedError(op.peer, attempts, reason)
        log.warning("write to %s: %s; retrying them (attempt %d)", op.peer, reason, attempts + 1)
        op.data["attempts"] = attempts + 1
        self._stats["put_retries"] += 1
        try:
            self._put(op, self._peers.endpoint(op.peer, refresh=True), ended.failed)
        except TransferError as exc:
            return exc
        return None

    def _put(self, op: Operation, endpoint: Any, pending: Sequence[int]) -> None:
        """Puts of the ranges at `pending` (indices into the batch), then one flush."""
        regions = sorted((int(base), self._peers.remote_key(op.peer, endpoint, packed)) for base, packed in op.data["rkeys"])
        bases = np.array([base for base, _ in regions], dtype=np.int64)
        keys = np.array([key for _, key in regions], dtype=np.int64)
        src, dst, lengths = op.data["src"], op.data["destinations"], op.data["lengths"]
        if len(pending) < len(lengths):  # a retry: only the ranges that did not land
            src, dst, lengths = (values[np.asarray(pending)] for values in (src, dst, lengths))
        region_keys = keys[np.searchsorted(bases, dst, side="right") - 1]
        batch = ucp_direct.put_many(endpoint.handle, src, lengths, dst, region_keys)
        flush = ucp_direct.flush(endpoint.handle, self._worker.handle)
        op.requests.append(flush)
        op.data.update(rma=True, pending=pending, batch=batch, flush=flush)
        self._stats["puts"] += len(lengths)
        self._stats["puts_copied"] += batch.copied
