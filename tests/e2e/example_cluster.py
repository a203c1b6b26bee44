"""The example InferenceCluster the e2e tests apply, and the children the operator makes for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "inferencecluster.yaml"
NAME = "smollm2"  # metadata.name in the example
SELECTOR = f"kvferry.dev/cluster={NAME}"
CHILD_KINDS = "deployments,services,configmaps,serviceaccounts,roles,rolebindings,poddisruptionbudgets"
EXPECTED_CHILDREN = {
    "Deployment": 4,
    "Service": 4,
    "ConfigMap": 1,
    "ServiceAccount": 1,
    "Role": 1,
    "RoleBinding": 1,
    "PodDisruptionBudget": 3,
}


def example(name: str = NAME) -> dict[str, Any]:
    """The example as a dict, to edit; another name gives a second cluster beside the first."""
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["metadata"]["name"] = name
    return manifest
