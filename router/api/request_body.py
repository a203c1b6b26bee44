"""An OpenAI request body read, before any work: refused (another model, a field kvferry does not implement),
or turned into what the nodes take (its sampling fields as a SamplingSpec, with the grammar of a structured
output). Unsupported fields are refused by name, as OpenAI refuses a parameter it does not know, or with
`unsupported_fields: warn` logged, as vLLM does; never dropped unseen."""

from __future__ import annotations

import json
import logging

from pydantic import BaseModel

from kvferry.internal_api import GrammarSpec, SamplingSpec
from kvferry.router.api.errors import APIError
from kvferry.router.api.openai_schema import ContentPart, SamplingFields
from kvferry.router.config import UnsupportedFields

GREEDY_BELOW_TEMPERATURE = 1e-5
SMALLEST_TOP_P = 1e-6
log = logging.getLogger(__name__)


class RequestCheck:
    def __init__(self, model: str, unsupported: UnsupportedFields) -> None:
        self.model, self.unsupported = model, unsupported

    def __call__(self, body: BaseModel) -> None:
        """Raises APIError: 404 for another model, 400 naming the first unsupported field."""
        requested = getattr(body, "model", self.model)
        if requested != self.model:
            raise APIError(404, f"The model `{requested}` does not exist; this router serves `{self.model}`",
                           param="model", code="model_not_found")
        found = unsupported_fields(body)
        if not found:
            return
        if self.unsupported == "warn":
            log.warning("ignored what kvferry does not support in a request: %s", ", ".join(found))
            return
        raise APIError(400, f"Unsupported parameter(s): {', '.join(found)}: kvferry does not implement "
                       f"{'them' if len(found) > 1 else 'it'}", param=found[0], code="unsupported_parameter")


def unsupported_fields(part: BaseModel, path: str = "") -> list[str]:
    """Where `part` (a request body) holds what kvferry does not implement, as paths ("tools",
    "messages[0].tool_calls", "messages[1].content[0].type=image_url"): fields no model declares, and content
    parts other than text."""
    found = [f"{path}type={part.type}"] if isinstance(part, ContentPart) and part.type not in part.text_types else []
    found += [f"{path}{name}" for name in part.model_extra or {}]
    for name in type(part).model_fields:
        value = getattr(part, name)
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for index, item in items:
            if isinstance(item, BaseModel):
                where = f"{path}{name}" + (f"[{index}]" if index is not None else "")
                found += unsupported_fields(item, f"{where}.")
    return found


def sampling_spec(body: SamplingFields, max_tokens: int, logprobs: int | None,
                  forced: GrammarSpec | None = None) -> SamplingSpec:
    """`forced`: the grammar of a forced tool call, which a structured output cannot join."""
    structured = grammar_of(body)
    if forced is not None and structured is not None:
        raise APIError(400, "a forced tool call and a structured output both constrain the answer: give one",
                       param="tool_choice")
    def given(value: float | int | None, default: float | int) -> float | int:
        return default if value is None else value

    temperature = given(body.temperature, 1.0)
    spec = SamplingSpec(
        # As vLLM does: a temperature this close to 0 is greedy (dividing logits by it overflows).
        n=1, temperature=0.0 if temperature < GREEDY_BELOW_TEMPERATURE else temperature,
        # A top_p this small keeps only the top token either way; smaller ones underflow to 0 in the
        # sampler's float32 and drop every token.
        top_p=max(given(body.top_p, 1.0), SMALLEST_TOP_P), top_k=given(body.top_k, 0),
        min_p=given(body.min_p, 0.0), seed=body.seed, presence_penalty=given(body.presence_penalty, 0.0),
        frequency_penalty=given(body.frequency_penalty, 0.0), repetition_penalty=given(body.repetition_penalty, 1.0),
        stop=[body.stop] if isinstance(body.stop, str) else list(body.stop or []),
        stop_token_ids=list(body.stop_token_ids or []), ignore_eos=body.ignore_eos, max_tokens=max_tokens,
        min_tokens=body.min_tokens or 0, grammar=forced or structured, logprobs=logprobs,
    )
    try:
        spec.to_params()  # the engine's own checks, before any node is called
    except (TypeError, ValueError) as exc:
        raise APIError(400, str(exc)) from None
    return spec


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
