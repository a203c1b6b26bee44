"""A chat request's tools: what the template is given, the grammar that forces a call (`required`, a named
function), and the parser that finds the calls in each choice's output (router/api/tool_parsers.py).

Forced calls are written as JSON that a grammar holds to (vLLM's way): `required` as an array of
`{"name", "parameters"}` objects, a named function as its arguments alone. So they always parse and fit
each tool's schema, whatever the model's family and whether its template renders tools at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvferry.internal_api import GrammarSpec
from kvferry.router.api.errors import APIError
from kvferry.router.api.openai_schema import ChatCompletionRequest, ChatMessage, Tool
from kvferry.router.api.tool_parsers import (
    HERMES_CLOSE,
    HERMES_OPEN,
    NamedParser,
    RequiredParser,
    ToolCallFormat,
    ToolCallParser,
    parser_for_auto,
)

ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ToolUse:
    tools: list[Tool]
    choice: str  # "auto", "required", or the function's name
    parallel: bool
    format: ToolCallFormat

    @classmethod
    def of(cls, body: ChatCompletionRequest, fmt: ToolCallFormat) -> ToolUse | None:
        """None when the request offers no tools or says `none`. Raises APIError (400, naming the field) for a
        choice without tools, two tools of one name, or an unknown function."""
        choice = body.tool_choice
        if not body.tools:
            if choice not in (None, "none"):
                raise APIError(400, "tool_choice needs tools: the request offers none", param="tool_choice")
            return None
        names = [tool.function.name for tool in body.tools]
        if len(set(names)) != len(names):
            raise APIError(400, "two tools have the same function name", param="tools")
        if choice == "none":
            return None
        named = choice if isinstance(choice, str) or choice is None else choice.function.name
        if named not in (None, "auto", "required") and named not in names:
            raise APIError(400, f"tool_choice names the function `{named}`, which is not among the tools "
                           f"({', '.join(names)})", param="tool_choice")
        return cls(body.tools, named or "auto", body.parallel_tool_calls, fmt)

    def template_tools(self) -> list[dict[str, Any]]:
        return template_tools(self.tools)

    def grammar(self) -> GrammarSpec | None:
        """The JSON a forced call is written as; None for `auto` (the model chooses, in its own form)."""
        if self.choice == "auto":
            return None
        if self.choice != "required":
            return GrammarSpec(kind="json_schema", spec=json.dumps(self._parameters(self.choice)))
        calls = [{"type": "object", "properties": {"name": {"const": tool.function.name},
                                                   "parameters": tool.function.parameters or ANY_OBJECT},
                  "required": ["name", "parameters"], "additionalProperties": False} for tool in self.tools]
        array: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not self.parallel:
            array["maxItems"] = 1
        return GrammarSpec(kind="json_schema", spec=json.dumps(array))

    def parser(self) -> ToolCallParser:
        if self.choice == "auto":
            return parser_for_auto(self.format)
        if self.choice == "required":
            return RequiredParser()
        return NamedParser(self.choice)

    def _parameters(self, name: str) -> dict[str, Any]:
        return next(tool.function.parameters or ANY_OBJECT for tool in self.tools if tool.function.name == name)


def template_tools(tools: list[Tool]) -> list[dict[str, Any]]:
    """The tools as chat templates take them (OpenAI's form, as transformers passes them)."""
    return [tool.model_dump(exclude_none=True, by_alias=True) for tool in tools]


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as chat templates read them: an assistant's calls with their arguments as objects (the
    templates write them with `tojson`), and a tool result's call id."""
    rendered = []
    for message in messages:
        entry: dict[str, Any] = {"role": message.role, "content": message.text()}
        if message.tool_calls:
            entry["tool_calls"] = [{"id": call.id, "type": "function",
                                    "function": {"name": call.function.name, "arguments": _object(call.function.arguments)}}
                                   for call in message.tool_calls]
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            entry["name"] = message.name
        rendered.append(entry)
    return rendered


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    """For a template that does not render tools: Hermes' instructions (as Qwen 2.5's template writes them), so
    the model still learns its tools and the form `auto` parses."""
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
            f"function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n</tools>\n\nFor each function "
            "call, return a json object with function name and arguments within "
            f'{HERMES_OPEN}{HERMES_CLOSE} XML tags:\n{HERMES_OPEN}\n{{"name": <function-name>, "arguments": '
            f"<args-json-object>}}\n{HERMES_CLOSE}")


def _object(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # as the client sent it: the template writes what it gets
