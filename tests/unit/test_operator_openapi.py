"""The pydantic -> structural schema translator, on small models."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from kvferry.operator.openapi import structural_schema


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: int = Field(3, gt=0, lt=10, description="size")


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inner: Inner | None = Field(None, description="optional inner")
    kind: Literal["a", "b"] = Field("a", description="kind")
    free: dict[str, Any] = Field(default_factory=dict, description="anything")
    tags: list[str] = Field(default_factory=list, description="tags")


def test_translation() -> None:
    assert structural_schema(Outer) == {
        "type": "object",
        "properties": {
            "inner": {
                "description": "optional inner",
                "type": "object",
                "properties": {
                    "size": {
                        "description": "size",
                        "type": "integer",
                        "default": 3,
                        "minimum": 0,
                        "exclusiveMinimum": True,
                        "maximum": 10,
                        "exclusiveMaximum": True,
                    }
                },
            },
            "kind": {"description": "kind", "type": "string", "default": "a", "enum": ["a", "b"]},
            "free": {
                "description": "anything",
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
            },
            "tags": {"description": "tags", "type": "array", "items": {"type": "string"}},
        },
    }


def test_unknown_keyword_is_an_error() -> None:
    class Tuple(BaseModel):
        pair: tuple[int, str] = Field(description="pair")  # prefixItems has no structural form

    with pytest.raises(ValueError, match="prefixItems"):
        structural_schema(Tuple)


def test_union_of_two_types_is_an_error() -> None:
    class Either(BaseModel):
        value: int | list[int] = Field(description="either")

    with pytest.raises(ValueError, match="several non-null options"):
        structural_schema(Either)
