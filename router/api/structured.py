"""A request's structured output, as the grammar the decode node's sampler holds its tokens to
(engine/grammar.py): OpenAI's `response_format`, or vLLM's `structured_outputs` extra field."""

from __future__ import annotations

import json

from kvferry.internal_api import GrammarSpec
from kvferry.router.api.errors import APIError
from kvferry.router.api.openai_schema import SamplingFields


def grammar_of(body: SamplingFields) -> GrammarSpec | None:
    """None for free text. Raises APIError (400, naming the field) for a request that asks for two things or
    for nothing in a field that must say what."""
    response_format = body.response_format if body.response_format and body.response_format.type != "text" else None
    structured = body.structured_outputs
    if response_format is not None and structured is not None:
        raise APIError(400, "response_format and structured_outputs both ask for a structured output: give one",
                       param="structured_outputs")
    if response_format is not None:
        if response_format.type == "json_object":
            return GrammarSpec(kind="json_object")
        if response_format.json_schema is None:
            raise APIError(400, "a json_schema response_format needs its json_schema: {name, schema}",
                           param="response_format.json_schema")
        return GrammarSpec(kind="json_schema", spec=json.dumps(response_format.json_schema.schema_))
    if structured is None:
        return None
    given = {name: value for name, value in (("json", structured.json_), ("regex", structured.regex),
                                              ("choice", structured.choice)) if value is not None}
    if len(given) != 1:
        raise APIError(400, f"structured_outputs takes exactly one of json, regex and choice, got {sorted(given) or 'none'}",
                       param="structured_outputs")
    (name, value), = given.items()
    if name == "json":
        return GrammarSpec(kind="json_schema", spec=json.dumps(value))
    return GrammarSpec(kind=name, spec=value if name == "regex" else json.dumps(value))
