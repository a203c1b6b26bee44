"""Endpoints to other engines, found by name in the node registry, and the remote keys unpacked on them."""

from __future__ import annotations

from typing import Any

from kvferry.kvcache.node_registry import PeerRegistry, RegistryUnavailableError
from kvferry.transfer import ucp_direct
from kvferry.transfer.errors import PeerUnreachableError
from kvferry.transfer.ucx import UcxWorker


class Peers:
    def __init__(self, worker: UcxWorker, registry: PeerRegistry) -> None:
        self._worker = worker
        self._registry = registry
        self._endpoints: dict[str, Any] = {}
        # The address each peer's endpoint was made for, kept when the endpoint is dropped (a timed-out
        # operation drops it): what a new endpoint connects to while the registry cannot say.
        self._addresses: dict[str, bytes] = {}
        self._rkeys: dict[str, dict[str, int]] = {}  # peer -> packed remote key -> unpacked, per endpoint

    def endpoint(self, peer: str, address: bytes | None = None, refresh: bool = False) -> Any:
        """The cached endpoint to `peer`. A new operation passes refresh=True: the registry is asked for
        the peer's current address, so a peer that restarted (new address) gets a new endpoint. Replies
        inside an operation use the cache, or the address the peer sent."""
        cached = self._endpoints.get(peer)
        if address is None and (refresh or cached is None):
            address = self._current_address(peer)
        if cached is not None and (address is None or self._addresses[peer] == address):
            return cached
        endpoint = self._worker.connect(address)  # a restarted peer has a new address: a new endpoint
        self._endpoints[peer] = endpoint
        self._addresses[peer] = address
        return endpoint

    def _current_address(self, peer: str) -> bytes:
        """The peer's address from the registry. While Redis restarts, or is back empty until the peer's next
        heartbeat writes its record again, a peer known before keeps its last address (if it is gone, the
        operation fails on it, as it would have anyway)."""
        try:
            record, missing = self._registry.lookup(peer), "is not in the registry"
        except RegistryUnavailableError as exc:
            record, missing = None, f"cannot be looked up: {exc}"
        if record is not None:
            return bytes.fromhex(str(record["address"]))
        if peer in self._addresses:
            return self._addresses[peer]
        raise PeerUnreachableError(f"peer {peer!r} {missing}")

    def drop(self, peer: str) -> None:
        """Forget the endpoint to `peer` and the remote keys on it; closing it cancels its requests."""
        for rkey in self._rkeys.pop(peer, {}).values():
            ucp_direct.destroy_rkey(rkey)
        cached = self._endpoints.pop(peer, None)
        if cached is not None:
            cached.close()

    def remote_key(self, peer: str, endpoint: Any, packed: str) -> int:
        """A remote key `peer` sent (hex), unpacked on `endpoint` once and kept while the endpoint lives."""
        cache = self._rkeys.setdefault(peer, {})
        if packed not in cache:
            cache[packed] = ucp_direct.unpack_rkey(endpoint.handle, bytes.fromhex(packed))
        return cache[packed]

    def release_remote_keys(self) -> None:
        """Remote keys are UCX objects of this worker: given back before it goes."""
        for peer in list(self._rkeys):
            for rkey in self._rkeys.pop(peer).values():
                ucp_direct.destroy_rkey(rkey)
