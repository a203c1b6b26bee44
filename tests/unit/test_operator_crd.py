"""The CRD generated from the pydantic model: drift, structure, descriptions, bounds and defaults."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvferry.operator.crd import CHART_CRD_PATH, main, render_crd, render_crd_yaml
from kvferry.operator.crd_model import InferenceClusterSpec

REPO = Path(__file__).resolve().parents[2]
MINIMAL_SPEC = {"model": {"source": "/models/tiny", "servedName": "tiny"}}


def spec_schema() -> dict[str, Any]:
    return render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from walk(prop, f"{path}.{name}")
    if "items" in schema:
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """What the apiserver's structural defaulting does: top-down, defaults only where a field is absent."""
    if not isinstance(value, dict) or "properties" not in schema:
        return value
    result = dict(value)
    for name, prop in schema["properties"].items():
        if name not in result and "default" in prop:
            result[name] = copy.deepcopy(prop["default"])
        if name in result:
            result[name] = apply_defaults(prop, result[name])
    return result


def test_chart_crd_matches_the_model() -> None:
    assert (REPO / CHART_CRD_PATH).read_text() == render_crd_yaml(), "run: python -m kvferry.operator.crd"


def test_check_mode_reports_drift(tmp_path: Path) -> None:
    stale = tmp_path / "crd.yaml"
    stale.write_text("# stale\n")
    assert main(["--output", str(stale), "--check"]) == 1
    assert main(["--output", str(stale)]) == 0
    assert main(["--output", str(stale), "--check"]) == 0


def test_schema_is_structural() -> None:
    text = yaml.safe_dump(render_crd())
    for forbidden in ("$ref", "anyOf", "oneOf", "allOf", "title", "additionalProperties: false", "'null'"):
        assert forbidden not in text
    for path, node in walk(spec_schema()):
        has_type = "type" in node
        escape = node.get("x-kubernetes-int-or-string") or node.get("x-kubernetes-preserve-unknown-fields")
        assert has_type or escape, f"spec{path} has no type"


def test_every_field_has_a_description() -> None:
    schema = render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    missing = [
        path
        for path, node in walk(schema)
        if path and not path.endswith(("{}", "[]")) and not node.get("description")
    ]
    assert missing == [".metadata"]  # metadata's schema belongs to the apiserver


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (".prefill.replicas", {"minimum": 0, "maximum": 1024, "default": 1, "type": "integer"}),
        (".decode.replicas", {"minimum": 0, "default": 1}),
        (".kvCache.blockSize", {"enum": [8, 16, 32, 64, 128], "default": 16}),
        (".kvCache.memoryFraction", {"minimum": 0, "exclusiveMinimum": True, "maximum": 1, "default": 0.9}),
        (".kvCache.dtype", {"enum": ["auto", "float16", "bfloat16", "float32"], "default": "auto"}),
        (".transfer.protocol", {"enum": ["ucx"], "default": "ucx"}),
        (".router.serviceType", {"enum": ["ClusterIP", "LoadBalancer"], "default": "ClusterIP"}),
        (".router.port", {"minimum": 1, "maximum": 65535}),
        (".model.source", {"minLength": 1, "type": "string"}),
        (".redis.url", {"pattern": "^rediss?://.+"}),
        (".prefill.resources.limits{}", {"x-kubernetes-int-or-string": True}),
        (".prefill.env", {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}),
        (".prefill.affinity", {"x-kubernetes-preserve-unknown-fields": True, "type": "object"}),
    ],
)
def test_bounds_enums_and_defaults(path: str, expected: dict[str, Any]) -> None:
    node = dict(walk(spec_schema()))[path]
    assert {key: node.get(key) for key in expected} == expected


def test_required_fields() -> None:
    root = render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert root["required"] == ["spec"]
    assert spec_schema()["required"] == ["model"]
    assert spec_schema()["properties"]["model"]["required"] == ["source", "servedName"]


def test_redis_url_and_managed_exclude_each_other_and_a_password_needs_a_url_in_cel() -> None:
    rules = spec_schema()["properties"]["redis"]["x-kubernetes-validations"]
    assert rules == [
        {"rule": "!(has(self.url) && self.managed)", "message": "set redis.url or redis.managed, not both"},
        {"rule": "!has(self.passwordSecret) || has(self.url)",
         "message": "redis.passwordSecret is the password of redis.url's Redis (a managed one has its own)"},
    ]


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_autoscaling_and_scaling_externally_exclude_each_other_in_cel(role: str) -> None:
    assert spec_schema()["properties"][role]["x-kubernetes-validations"] == [
        {"rule": "!(has(self.autoscaling) && has(self.scaleExternally) && self.scaleExternally)",
         "message": "autoscaling and scaleExternally both set the pod count: choose one"}
    ]


def test_schema_defaults_equal_model_defaults() -> None:
    defaulted = apply_defaults(spec_schema(), MINIMAL_SPEC)
    assert defaulted["kvCache"] == {"blockSize": 16, "memoryFraction": 0.9, "dtype": "auto"}
    from_schema = InferenceClusterSpec.model_validate(defaulted)
    assert from_schema == InferenceClusterSpec.model_validate(MINIMAL_SPEC)


def test_resource_names_subresource_and_printer_columns() -> None:
    crd = render_crd()
    assert crd["metadata"]["name"] == "inferenceclusters.kvferry.dev"
    assert crd["spec"]["names"]["shortNames"] == ["ic"]
    version = crd["spec"]["versions"][0]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Prefill Ready": ".status.prefill.ready",
        "Decode Ready": ".status.decode.ready",
        "Router": ".status.routerEndpoint",
        "Age": ".metadata.creationTimestamp",
        "Model": ".spec.model.servedName",
    }


def test_status_schema_has_conditions_keyed_by_type() -> None:
    status = render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert conditions["items"]["properties"]["type"]["enum"] == ["Ready", "Progressing", "Degraded"]
    assert status["properties"]["phase"]["enum"] == ["Pending", "Progressing", "Ready", "Degraded"]
    assert set(status["properties"]) == {
        "phase",
        "conditions",
        "prefill",
        "decode",
        "router",
        "observedGeneration",
        "routerEndpoint",
        "autoscaling",
    }
