"""Named policies: the scorer weights used to choose the prefill node and the decode node.

Colocated nodes (no prefill nodes configured) prefill themselves, so they are chosen with the policy's
prefill weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvferry.router.scheduling.scorers import SCORERS

ScorerWeights = Mapping[str, float]

# Decode nodes are chosen by KV capacity and load (and how much of the prompt they already hold).
DECODE_BY_CAPACITY: ScorerWeights = {"kv_pressure": 1.0, "queue_depth": 1.0, "transfer_cost": 0.5}
DEFAULT_PREFILL: ScorerWeights = {"prefix_hit": 2.0, "queue_depth": 1.0, "kv_pressure": 0.5}


@dataclass(frozen=True)
class Policy:
    name: str
    prefill: ScorerWeights = field(default_factory=dict)
    decode: ScorerWeights = field(default_factory=dict)

    def __post_init__(self) -> None:
        for weights in (self.prefill, self.decode):
            unknown = sorted(set(weights) - set(SCORERS))
            if unknown:
                raise ValueError(f"policy {self.name!r}: unknown scorers {unknown}; known: {sorted(SCORERS)}")
            if any(weight < 0 for weight in weights.values()):
                raise ValueError(f"policy {self.name!r}: scorer weights must be >= 0")


POLICIES: dict[str, Policy] = {
    policy.name: policy
    for policy in (
        Policy("round_robin"),
        Policy("least_load", prefill={"queue_depth": 1.0}, decode={"queue_depth": 1.0, "kv_pressure": 1.0}),
        # The queue weight only breaks ties (a hit of one block in a hundred outweighs it): prompts cached
        # nowhere go to the shorter queue instead of taking blind turns, which piled a burst of new groups'
        # misses on one node.
        Policy("prefix", prefill={"prefix_hit": 1.0, "queue_depth": 0.01}, decode=DECODE_BY_CAPACITY),
        Policy("default", prefill=DEFAULT_PREFILL, decode=DECODE_BY_CAPACITY),
        # The default, and a conversation's next turn where its last went (the decode node holds its answer's
        # KV) while that node is not overloaded. Not the default: on two CPU cores it was slower than the
        # default for multi-turn conversations (benchmarks/multi_turn_sessions.py, docs/benchmarks.md).
        Policy("session", prefill={**DEFAULT_PREFILL, "session": 1.5}, decode={**DECODE_BY_CAPACITY, "session": 2.0}),
    )
}
