"""One scheduling decision: the P/D decision (disaggregate this prompt, or prefill it on the decode node),
then filters, weighted scorers and the picker; decode node first (its stream opens first in the P/D flow,
and the prefill choice may depend on where it is). The prefix lookup before it is prefix_lookup.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from kvferry.router.discovery.nodes import NodeView, Role
from kvferry.router.scheduling.filters import FILTERS, Filter, healthy
from kvferry.router.scheduling.pd_decision import PDDecision
from kvferry.router.scheduling.picker import MaxScorePicker
from kvferry.router.scheduling.policies import Policy, ScorerWeights
from kvferry.router.scheduling.request import SchedulingRequest
from kvferry.router.scheduling.scorers import SCORERS

DEFAULT_FILTERS = ("healthy", "model")


class NoNodeAvailable(RuntimeError):
    """No node of a role passed the filters: the cluster cannot take the request now."""

    def __init__(self, role: Role) -> None:
        super().__init__(f"no healthy {role} node is available")
        self.role = role


@dataclass(frozen=True)
class Decision:
    decode: NodeView
    prefill: NodeView | None  # None: the decode node prefills (colocated, no prefill node up, or chosen)
    cached_blocks: int  # leading prompt blocks the prefilling node holds, per the index
    colocated: bool = False  # the cluster has no prefill nodes at all
    kept_on_decode: bool = False  # the P/D decision chose to prefill on the decode node


class Scheduler:
    def __init__(self, policy: Policy, filters: Sequence[str] = DEFAULT_FILTERS, pd: PDDecision | None = None) -> None:
        self.policy = policy
        self.filters: list[Filter] = [FILTERS[name] for name in filters]
        self.picker = MaxScorePicker()
        self.pd = pd or PDDecision()

    @property
    def policy_name(self) -> str:
        return self.policy.name

    def schedule(self, request: SchedulingRequest, nodes: Sequence[NodeView]) -> Decision:
        prefill_nodes = self._candidates(request, nodes, "prefill")
        colocated = not any(node.role == "prefill" for node in nodes)
        kept = bool(prefill_nodes) and not self.pd.disaggregate(request.uncached_tokens(prefill_nodes))
        if kept:
            prefill_nodes = []
        decode_nodes = self._candidates(request, nodes, "decode")
        if prefill_nodes:
            # While a model rolls out, old and new nodes serve side by side: a decode node that some prefill
            # node can hand KV to comes first, and its prefill node is one of those.
            decode_nodes = _paired(decode_nodes, prefill_nodes) or decode_nodes
        # Without a prefill node to take the prompt, the decode node prefills: choose it as a prefill node.
        decode_weights = self.policy.decode if prefill_nodes else self.policy.prefill
        decode = self._pick(request, decode_nodes, decode_weights, "decode")
        prefill_nodes = [node for node in prefill_nodes if node.exchanges_kv_with(decode)]
        if not prefill_nodes:
            return Decision(decode, None, request.cached_blocks.get(decode.name, 0), colocated=colocated,
                            kept_on_decode=kept)
        prefill = self._pick(dataclasses.replace(request, decode=decode), prefill_nodes, self.policy.prefill, "prefill")
        return Decision(decode, prefill, request.cached_blocks.get(prefill.name, 0))

    def _candidates(self, request: SchedulingRequest, nodes: Sequence[NodeView], role: Role) -> list[NodeView]:
        candidates = [node for node in nodes if node.role == role]
        for keep in self.filters:
            kept = keep(request, candidates)
            # Panic routing (as Envoy's panic threshold): with every decode node ejected, a starved but
            # living one may still serve, where refusing everything certainly does not. Prefill has the
            # decode node's local prefill to fall back on instead.
            if not kept and keep is healthy and role == "decode":
                continue
            candidates = kept
        return candidates

    def _pick(self, request: SchedulingRequest, nodes: list[NodeView], weights: ScorerWeights, role: Role) -> NodeView:
        if not nodes:
            raise NoNodeAvailable(role)
        total = [0.0] * len(nodes)
        for name, weight in weights.items():
            if weight:
                for index, score in enumerate(SCORERS[name](request, nodes)):
                    total[index] += weight * score
        return self.picker.pick(role, nodes, total)


def _paired(decode_nodes: list[NodeView], prefill_nodes: list[NodeView]) -> list[NodeView]:
    # Per request, on every decode node: a set of the prefill nodes' identities (NodeView.exchanges_kv_with's
    # rule: equal, an unknown one only with an unknown one), not a pairwise check.
    identities = {prefill.kv_identity for prefill in prefill_nodes}
    return [decode for decode in decode_nodes if decode.kv_identity in identities]
