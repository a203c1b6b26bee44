"""Scorers: each rates every candidate in [0, 1], higher is better. An unknown load reads as neutral (0.5)
so that a node whose heartbeat has not reported yet is neither preferred nor avoided."""

from __future__ import annotations

from collections.abc import Callable

from kvferry.router.discovery.nodes import NodeView
from kvferry.router.scheduling.request import SchedulingRequest

Scorer = Callable[[SchedulingRequest, list[NodeView]], list[float]]
NEUTRAL = 0.5


def prefix_hit(request: SchedulingRequest, nodes: list[NodeView]) -> list[float]:
    """The share of the prompt's full blocks the node already holds (prefix index)."""
    if request.num_blocks == 0:
        return [0.0 for _ in nodes]
    return [min(1.0, request.cached_blocks.get(node.name, 0) / request.num_blocks) for node in nodes]


def queue_depth(_: SchedulingRequest, nodes: list[NodeView]) -> list[float]:
    """Shortest queue 1, longest 0, linear between (llm-d's queue scorer); all equal: 1."""
    depths = [node.queue_depth for node in nodes]
    low, high = min(depths, default=0), max(depths, default=0)
    if high == low:
        return [1.0 for _ in nodes]
    return [(high - depth) / (high - low) for depth in depths]


def kv_pressure(_: SchedulingRequest, nodes: list[NodeView]) -> list[float]:
    """The free share of the node's KV pool."""
    return [
        node.free_blocks / node.total_blocks if node.free_blocks is not None and node.total_blocks else NEUTRAL
        for node in nodes
    ]


def transfer_cost(request: SchedulingRequest, nodes: list[NodeView]) -> list[float]:
    """1 where moving the prompt's KV is cheapest. A decode node scores the share of the prompt it already
    holds (those blocks are not sent); a prefill node scores 1 on the chosen decode node's host (shared
    memory or CUDA IPC instead of the network), 0 elsewhere."""
    if request.decode is None:
        return prefix_hit(request, nodes)
    return [1.0 if node.host == request.decode.host else 0.0 for node in nodes]


# A session's node stops being preferred when its queue is longer than the shortest by more than this, or its
# KV pool this nearly full. Measured (benchmarks/multi_turn_sessions.py): with a slack of 4, the first turns of
# 4 conversations landed on one decode node (the other was idle when each arrived) and stayed there, and TTFT
# p50 was 9x prefix routing's; a conversation must not hold a node that has more to do than another.
SESSION_QUEUE_SLACK = 1
SESSION_MIN_FREE_KV = 0.05


def session(request: SchedulingRequest, nodes: list[NodeView]) -> list[float]:
    """1 for the node of the request's conversation's last turn (its KV is there) unless it is overloaded."""
    shortest = min((node.queue_depth for node in nodes), default=0)

    def preferred(node: NodeView) -> bool:
        full = node.free_blocks is not None and bool(node.total_blocks) and \
            node.free_blocks / node.total_blocks < SESSION_MIN_FREE_KV  # type: ignore[operator]
        return node.name in request.session_nodes and node.queue_depth <= shortest + SESSION_QUEUE_SLACK and not full

    return [1.0 if preferred(node) else 0.0 for node in nodes]


SCORERS: dict[str, Scorer] = {
    "prefix_hit": prefix_hit,
    "queue_depth": queue_depth,
    "kv_pressure": kv_pressure,
    "transfer_cost": transfer_cost,
    "session": session,
}
