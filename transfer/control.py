"""Control messages on the wire: sent to a peer by name, received into receives kept posted for any peer,
decoded (malformed ones counted and dropped) and handed to the engine's handler for their kind.

With a cluster token, every message carries a credential derived from it (`auth`), and a message without
the right one is counted and dropped before any handler sees it: a peer outside the cluster can neither
read a node's registered memory (its KV pool), nor write into it, nor disturb another peer's operations.
The credential is not the token itself, which also opens the nodes' HTTP API."""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from collections.abc import Callable
from typing import Any

from kvferry.transfer import protocol
from kvferry.transfer.operation import Operation
from kvferry.transfer.peers import Peers
from kvferry.transfer.ucx import Request, UcxWorker, request_error

log = logging.getLogger(__name__)


class ControlChannel:
    def __init__(
        self, worker: UcxWorker, peers: Peers, local_name: str, receives: int, stats: dict[str, int],
        closing: threading.Event, handle: Callable[[protocol.ControlMessage], None], cluster_token: str | None = None,
    ) -> None:
        self._credential = transfer_credential(cluster_token) if cluster_token else None
        self._worker = worker
        self._peers = peers
        self._local_name = local_name
        self._receives = receives
        self._stats = stats
        self._closing = closing
        self._handle = handle
        self._posted: list[tuple[Request, bytearray]] = []
        # Sends no operation tracks (replies such as read_reject), with their bytes, until UCX is done with
        # them: to a peer whose endpoint is still wiring up, UCX reads the buffer later, and a buffer freed
        # meanwhile went out as garbage (the reader counted a malformed message and timed out: CI, pods tier).
        self._unowned_sends: list[tuple[Request, bytes]] = []
        for _ in range(receives):  # several, so that several peers can talk at once
            self._post_receive()

    def send(
        self, peer: str, track: Operation | None, kind: str, refresh: bool = False, peer_address: bytes | None = None,
        **fields: Any,
    ) -> None:
        """Send a control message; `track` (the operation it belongs to) keeps it alive and polls it;
        `refresh` (a new operation) asks the registry for the peer's current address first, unless the
        caller knows it (`peer_address`, from the peer itself, as a destination handle carries it)."""
        if self._credential is not None:
            fields["auth"] = self._credential
        message = protocol.encode(kind, sender=self._local_name, **fields)
        endpoint = self._peers.endpoint(peer, peer_address, refresh=refresh)
        request = UcxWorker.send(endpoint, message, protocol.CONTROL_TAG)
        if track is not None:
            track.requests.append(request)
            track.keep.append(message)
        elif not request.completed:
            self._unowned_sends.append((request, message))

    def poll(self) -> None:
        """Handle the control messages that arrived, and post receives in place of theirs."""
        self._unowned_sends = [(request, message) for request, message in self._unowned_sends if not request.completed]
        pending = []
        for request, buffer in self._posted:
            if not request.completed:
                pending.append((request, buffer))
                continue
            if request_error(request) is None:
                try:
                    message = protocol.decode(memoryview(buffer))
                except protocol.MalformedMessage as exc:
                    self._stats["malformed_messages"] += 1
                    log.warning("dropped a malformed control message: %s", exc)
                    continue
                if not self._authentic(message):
                    self._stats["unauthenticated_messages"] += 1
                    log.warning("dropped a %s from %r without the cluster's credential", message.kind,
                                message.fields.get("sender"))
                    continue
                log.debug("%s <- %s op %s from %s", self._local_name, message.kind, message.fields.get("op"),
                          message.fields.get("sender"))
                self._handle(message)
        self._posted = pending
        while len(self._posted) < self._receives and not self._closing.is_set():
            self._post_receive()

    def _post_receive(self) -> None:
        buffer = bytearray(protocol.CONTROL_BUFFER_BYTES)
        self._posted.append((self._worker.recv_any(buffer, protocol.CONTROL_TAG), buffer))

    def _authentic(self, message: protocol.ControlMessage) -> bool:
        if self._credential is None:
            return True
        auth = message.fields.get("auth")
        return isinstance(auth, str) and hmac.compare_digest(auth, self._credential)


def transfer_credential(cluster_token: str) -> str:
    return hashlib.sha256(b"kvferry-transfer\0" + cluster_token.encode()).hexdigest()
