"""The picker: the highest weighted score wins; ties rotate, so equal nodes share the load in turn
(with no scorers at all this is round robin)."""

from __future__ import annotations

from collections import defaultdict

from kvferry.router.discovery.nodes import NodeView

TIE_TOLERANCE = 1e-9


class MaxScorePicker:
    def __init__(self) -> None:
        self._turns: dict[str, int] = defaultdict(int)

    def pick(self, lane: str, nodes: list[NodeView], scores: list[float]) -> NodeView:
        """`lane` keeps separate turns for separate choices (prefill, decode)."""
        best = max(scores)
        tied = sorted((node for node, score in zip(nodes, scores, strict=True) if score >= best - TIE_TOLERANCE),
                      key=lambda node: node.name)
        turn = self._turns[lane]
        self._turns[lane] = turn + 1
        return tied[turn % len(tied)]
