"""Operator-side validation of a spec the apiserver has already accepted.

The CRD schema rejects what it can at apply time; what passes it but cannot work (a model source such as
a relative path or an s3:// URL) is caught here, by the same pydantic models, and reported as a Degraded
condition naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from kvferry.operator.crd_model import InferenceClusterSpec


class InvalidSpec(ValueError):
    """A spec the operator cannot build children from; the message names the field(s)."""


def _field_path(location: tuple[int | str, ...]) -> str:
    path = "spec"
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def parse_spec(raw: Mapping[str, Any] | None) -> InferenceClusterSpec:
    try:
        return InferenceClusterSpec.model_validate(dict(raw or {}))
    except ValidationError as error:
        problems = []
        for item in error.errors():
            # A validator's own ValueError is prefixed "Value error, " by pydantic; the rest says why.
            message = item["msg"].removeprefix("Value error, ")
            problems.append(f"{_field_path(item['loc'])}: {message}")
        raise InvalidSpec("; ".join(problems)) from None
