"""The generated CRD on a real apiserver: explain, defaults, and apply-time rejection naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from e2e.kube_cluster import Cluster

from kvferry.operator.crd_model import InferenceClusterSpec

MINIMAL = {"model": {"source": "/models/tiny", "servedName": "tiny"}}


def cluster_manifest(spec: dict[str, Any], name: str = "probe") -> dict[str, Any]:
    return {
        "apiVersion": "kvferry.dev/v1alpha1",
        "kind": "InferenceCluster",
        "metadata": {"name": name},
        "spec": spec,
    }


def test_explain_prints_field_descriptions(cluster: Cluster) -> None:
    out = cluster.kube.kubectl("explain", "inferencecluster.spec.prefill").stdout
    assert "Prefill nodes: compute prompts' KV cache and send it to decode nodes." in out
    assert "replicas\t<integer>" in out
    assert "Number of pods of this role." in out
    assert "CPU, memory and accelerator requests and limits per pod." in out
    kv = cluster.kube.kubectl("explain", "inferencecluster.spec.kvCache.memoryFraction").stdout
    assert "Fraction of the GPU's memory" in kv


def test_printer_columns_and_short_name(cluster: Cluster) -> None:
    cluster.apply(cluster_manifest(MINIMAL))
    header = cluster.kubectl("get", "ic").stdout.splitlines()[0].split()
    assert header == ["NAME", "PHASE", "PREFILL", "READY", "DECODE", "READY", "ROUTER", "AGE"]
    wide = cluster.kubectl("get", "inferenceclusters", "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-1] == "MODEL" and wide[1].split()[-1] == "tiny"


def test_apiserver_applies_the_models_defaults(cluster: Cluster) -> None:
    cluster.apply(cluster_manifest(MINIMAL))
    stored = cluster.get("inferencecluster", "probe")["spec"]
    assert stored["kvCache"] == {"blockSize": 16, "memoryFraction": 0.9, "dtype": "auto"}
    assert stored["prefill"]["replicas"] == 1 and stored["router"]["serviceType"] == "ClusterIP"
    assert InferenceClusterSpec.model_validate(stored) == InferenceClusterSpec.model_validate(MINIMAL)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({**MINIMAL, "prefill": {"replicas": -1}}, "spec.prefill.replicas: Invalid value: -1"),
        ({"image": "x"}, "spec.model: Required value"),
        ({**MINIMAL, "kvCache": {"blockSize": 12}}, "spec.kvCache.blockSize: Unsupported value: 12"),
        ({**MINIMAL, "kvCache": {"memoryFraction": 0}}, "spec.kvCache.memoryFraction: Invalid value: 0"),
        ({**MINIMAL, "transfer": {"protocol": "rdma"}}, 'spec.transfer.protocol: Unsupported value: "rdma"'),
        (
            {**MINIMAL, "redis": {"url": "redis://r:6379", "managed": True}},
            "set redis.url or redis.managed, not both",
        ),
        (
            {**MINIMAL, "redis": {"managed": True, "passwordSecret": {"name": "shared-redis"}}},
            "redis.passwordSecret is the password of redis.url's Redis",
        ),
        (
            {**MINIMAL, "decode": {"scaleExternally": True, "autoscaling": {"maxReplicas": 2, "itlP90Seconds": 0.1}}},
            "spec.decode: Invalid value: \"object\": autoscaling and scaleExternally both set the pod count",
        ),
        (
            {**MINIMAL, "decode": {"resources": {"limits": {"cpu": "lots"}}}},
            "spec.decode.resources.limits.cpu",
        ),
    ],
)
def test_invalid_specs_are_rejected_naming_the_field(
    cluster: Cluster, spec: dict[str, Any], expected: str
) -> None:
    done = cluster.kubectl("apply", "-f", "-", input=json.dumps(cluster_manifest(spec)), check=False)
    assert done.returncode != 0, done.stdout
    assert expected in done.stderr
    assert cluster.get("inferencecluster", "probe") is None


def test_unknown_field_is_rejected_with_strict_validation(cluster: Cluster) -> None:
    manifest = cluster_manifest({**MINIMAL, "prefil": {"replicas": 2}})
    done = cluster.kubectl("apply", "--validate=strict", "-f", "-", input=json.dumps(manifest), check=False)
    assert done.returncode != 0
    assert 'unknown field "spec.prefil"' in done.stderr
    assert cluster.get("inferencecluster", "probe") is None


def test_name_that_cannot_name_children_is_rejected(cluster: Cluster) -> None:
    done = cluster.kubectl(
        "apply", "-f", "-", input=json.dumps(cluster_manifest(MINIMAL, "x" * 51)), check=False
    )
    assert done.returncode != 0
    assert "metadata.name must be at most 50 characters" in done.stderr
