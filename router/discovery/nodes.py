"""What the router knows about one node when it schedules a request: a frozen snapshot.

Load fields come from the node's registry record (its heartbeat) and are None while unknown; `inflight`
is the router's own count of requests it has sent there, fresher than any heartbeat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

Role = Literal["prefill", "decode"]


@dataclass(frozen=True)
class Endpoint:
    """A node as discovery sees it: where it answers and what it does."""

    url: str
    role: Role


@dataclass(frozen=True)
class NodeView:
    name: str  # the registry's name (the prefix index's too); the URL when no record names it
    url: str
    role: Role
    healthy: bool = True
    model: str | None = None
    inflight: int = 0
    running: int | None = None
    waiting: int | None = None
    free_blocks: int | None = None
    total_blocks: int | None = None
    block_size: int | None = None
    max_model_len: int | None = None
    # What KV it computes and takes (kvcache/compatibility.py); None while its record has no pool.
    kv_identity: str | None = None

    def exchanges_kv_with(self, other: NodeView) -> bool:
        """Whether KV one computes may continue on the other. An unknown identity pairs only with another
        unknown one (a cluster without a registry knows none): a pod whose record the router has not read yet
        is, mid-rollout, as likely the new model as the old, and the transfer would refuse the mismatch."""
        return self.kv_identity == other.kv_identity

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def queue_depth(self) -> int:
        """Requests ahead of a new one: the router's own in flight plus what the node reports waiting."""
        return self.inflight + (self.waiting or 0)
