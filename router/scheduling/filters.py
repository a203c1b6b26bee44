"""Filters: which nodes may take a request at all. Each keeps the nodes it accepts, in order."""

from __future__ import annotations

from collections.abc import Callable

from kvferry.router.discovery.nodes import NodeView
from kvferry.router.scheduling.request import SchedulingRequest

Filter = Callable[[SchedulingRequest, list[NodeView]], list[NodeView]]


def healthy(_: SchedulingRequest, nodes: list[NodeView]) -> list[NodeView]:
    return [node for node in nodes if node.healthy]


def serves_model(request: SchedulingRequest, nodes: list[NodeView]) -> list[NodeView]:
    # A node whose record does not name its model yet is given the benefit of the doubt.
    return [node for node in nodes if node.model is None or node.model == request.model]


FILTERS: dict[str, Filter] = {"healthy": healthy, "model": serves_model}
