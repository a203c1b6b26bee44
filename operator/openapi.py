"""Pydantic JSON Schema -> Kubernetes structural openAPIV3Schema.

A CRD schema must be structural: every node has a type (or an x-kubernetes-* escape), there are no
$ref, anyOf-with-null or additionalProperties: false, and bounds are OpenAPI 3.0 style. This is a strict
translator: a keyword it does not know is an error, so a new pydantic feature cannot slip into the CRD
unnoticed (or silently lose a constraint).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

# Keywords copied unchanged: Kubernetes' JSONSchemaProps understands them with the same meaning.
_PASSTHROUGH = {
    "type",
    "format",
    "description",
    "enum",
    "default",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "required",
    "nullable",
}
_NULL = {"type": "null"}


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, mode="validation")
    definitions = schema.pop("$defs", {})
    return _convert(schema, definitions)


def _convert(node: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    node = dict(node)
    while "$ref" in node or "anyOf" in node:
        if "anyOf" in node:
            node = _collapse_any_of(node)
        else:
            target = definitions[node.pop("$ref").rsplit("/", 1)[-1]]
            # Field-level keywords (its description, its default) win over the referenced model's.
            node = {**target, **node}
    result: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title":
            continue  # pydantic's generated titles would only clutter `kubectl explain`
        if key in _PASSTHROUGH or key.startswith("x-kubernetes-"):
            result[key] = value
        elif key == "properties":
            result[key] = {name: _convert(prop, definitions) for name, prop in value.items()}
        elif key == "items":
            result[key] = _convert(value, definitions)
        elif key == "additionalProperties":
            if value is True:
                result["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                result[key] = _convert(value, definitions)
            # False (extra="forbid") is the apiserver's behaviour already: unknown fields are pruned, or
            # rejected with --validate=strict; apiextensions/v1 forbids writing it down.
        elif key == "const":
            result["enum"] = [value]  # a one-value Literal; OpenAPI 3.0 has no const
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            result[bound] = value
            result[key] = True  # OpenAPI 3.0: a flag on minimum/maximum, not a number
        else:
            raise ValueError(f"JSON schema keyword {key!r} has no structural equivalent: {node}")
    if result.get("default", ...) is None:
        del result["default"]  # optional fields default to absent, not to null
    # description and type first: the generated YAML is read in review diffs.
    leading = [key for key in ("description", "type") if key in result]
    return {**{key: result[key] for key in leading}, **result}


def _collapse_any_of(node: dict[str, Any]) -> dict[str, Any]:
    options = [option for option in node.pop("anyOf") if option != _NULL]
    if len(options) != 1:
        raise ValueError(f"anyOf with several non-null options is not structural: {options}")
    # Optional[X] is just X that may be left out: "not required" already says so.
    return {**options[0], **node}
