"""Where the nodes are: a static list, the registry's records, or the Kubernetes API (kubernetes_discovery).
Every discovery answers `endpoints()` from memory; the ones that watch something update it in the background."""

from __future__ import annotations

from typing import Protocol

from kvferry.router.discovery.nodes import Endpoint
from kvferry.router.discovery.registry_view import RegistryView, normalize_url


class Discovery(Protocol):
    def endpoints(self) -> list[Endpoint]: ...

    def start(self) -> None:
        """Begin watching (if this discovery watches anything)."""
        ...

    def stop(self) -> None: ...


class StaticDiscovery:
    def __init__(self, prefill: list[str], decode: list[str]) -> None:
        self._endpoints = [Endpoint(normalize_url(url), "prefill") for url in prefill] + [
            Endpoint(normalize_url(url), "decode") for url in decode
        ]

    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class RegistryDiscovery:
    """Every node that publishes a live record with a role and a URL of the router's scheme (the view
    refreshes itself). With internal TLS, a record of a plain HTTP node is not the cluster's node: the cluster
    token is never sent to it in the clear."""

    def __init__(self, view: RegistryView, scheme: str = "http") -> None:
        self.view, self.prefix = view, f"{scheme}://"

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint(normalize_url(url), record["role"])
            for _, record in self.view.records()
            if record.get("role") in ("prefill", "decode") and not self.view.is_stale(record)
            and (url := str(record["url"])).startswith(self.prefix)
        ]

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass
