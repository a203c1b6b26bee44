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
        self._endpoints: dict[str, tuple[bytes, Any]] = {}
        self._rkeys: dict[str, dict[str, int]] = {}  # peer -> packed remote key -> unpacked, per endpoint

    def endpoint(self, peer: str, address: bytes | None = None, refresh: bool = False) -> Any:
        """The cached endpoint to `peer`. A new operation passes refresh=True: the registry is asked for
        the peer's current address, so a peer that restarted (new address) gets a new endpoint. Replies
        inside an operation use the cache, or the address the peer sent."""
        cached = self._endpoints.get(peer)
        if address is None and (refresh or cached is None):
            try:
                record, missing = self._registry.lookup(peer), "is not in the registry"
            except RegistryUnavailableError as exc:
                record, missing = None, f"cannot be looked up: {exc}"
            if record is None:
                # Redis restarting, or restarted empty until the peer's next heartbeat writes its record
                # again: a known peer keeps its last address (if it is gone, the operation fails on it).
                if cached is not None:
                    return cached[1]
                raise PeerUnreachableError(f"peer {peer!r} {missing}")
            address = bytes.fromhex(str(record["address"]))
        if cached is not None and (address is None or cached[0] == address):
            return cached[1]
        endpoint = self._worker.connect(address)  # a restarted peer has a new address: a new endpoint
        self._endpoints[peer] = (address, endpoint)
        return endpoint

    def drop(self, peer: str) -> None:
        """Forget the endpoint to `peer` and the remote keys on it; closing it cancels its requests."""
        for rkey in self._rkeys.pop(peer, {}).values():
            ucp_direct.destroy_rkey(rkey)
        cached = self._endpoints.pop(peer, None)
        if cached is not None:
            cached[1].close()

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
