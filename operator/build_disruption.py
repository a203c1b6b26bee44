"""PodDisruptionBudgets: one per serving role, so that a node drain or a cluster upgrade evicts one pod of
a role at a time and waits for its replacement to be Ready before the next (a voluntary disruption never
takes a role's last serving pods away together). A role of one pod can still be drained: maxUnavailable,
not minAvailable, is what keeps a single-replica role from blocking `kubectl drain` for good."""

from __future__ import annotations

from typing import Any

from kvferry.operator.naming import ClusterRef, ServingRole, child_metadata, selector_labels


def build_disruption_budget(ref: ClusterRef, role: ServingRole) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(ref, role),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(ref, role)}},
    }
