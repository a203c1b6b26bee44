"""A chat choice's output text split into content and tool calls, as it streams: one parser per choice, fed
the text as it comes, giving the content to send on and the `delta.tool_calls` entries of the calls found.

What a call looks like in the text depends on who decided to call:
- `tool_choice: auto`: the model, in its family's form: Hermes and Qwen templates' `<tool_call>{"name": ...,
  "arguments": {...}}</tool_call>` (any number, between text), or Llama 3's bare `{"name": ..., "parameters": {...}}`
  (the whole answer; several joined by ";").
- `required`: the grammar made the model write a JSON array of `{"name", "parameters"}` objects.
- a named function: the grammar made the model write that function's arguments, and nothing else.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from kvferry.router.api.parsed_output import Parsed

ToolCallFormat = Literal["hermes", "llama3_json"]
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCallOut:
    id: str
    name: str
    arguments: str  # JSON text

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallParser:
    """Base: the calls found so far, and the finish reason they make."""

    calls_finish_reason = "tool_calls"  # OpenAI's, when the model chose to call; a forced named call ends in "stop"

    def __init__(self) -> None:
        self.calls: list[ToolCallOut] = []

    def feed(self, text: str) -> Parsed:
        raise NotImplementedError

    def finish(self) -> Parsed:
        """The end of the output: whatever was held back, as content or calls."""
        return Parsed()

    def finish_reason(self, reason: str | None) -> str | None:
        return self.calls_finish_reason if self.calls and reason == "stop" else reason

    def _call(self, name: str, arguments: str) -> dict[str, Any]:
        call = ToolCallOut(new_call_id(), name, arguments)
        self.calls.append(call)
        return {"index": len(self.calls) - 1, **call.as_dict()}

    def _call_from_json(self, text: str) -> dict[str, Any] | None:
        """A delta for `{"name": ..., "arguments" or "parameters": {...}}`, or None for text that is not one."""
        try:
            value = json.loads(text)
        except ValueError:
            return None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        arguments = value.get("arguments", value.get("parameters", {}))
        return self._call(value["name"], json.dumps(arguments, ensure_ascii=False))


class HermesParser(ToolCallParser):
    """Content streams on until `<tool_call>`; each call is sent when its `</tool_call>` arrives. A tag's first
    characters are held back until it is clear whether they start one."""

    def __init__(self) -> None:
        super().__init__()
        self.pending = ""  # text not yet sent: a possible tag's start, or a call's body
        self.in_call = False

    def feed(self, text: str) -> Parsed:
        self.pending += text
        out = Parsed()
        while True:
            if self.in_call:
                end = self.pending.find(HERMES_CLOSE)
                if end < 0:
                    return out
                body, self.pending, self.in_call = self.pending[:end], self.pending[end + len(HERMES_CLOSE):], False
                delta = self._call_from_json(body.strip())
                if delta is None:  # not a call after all: the model's text, as written
                    out.content += HERMES_OPEN + body + HERMES_CLOSE
                else:
                    out.deltas.append(delta)
                continue
            start = self.pending.find(HERMES_OPEN)
            if start >= 0:
                out.content += self.pending[:start]
                self.pending, self.in_call = self.pending[start + len(HERMES_OPEN):], True
                continue
            keep = _tag_prefix_length(self.pending, HERMES_OPEN)
            out.content += self.pending[:len(self.pending) - keep]
            self.pending = self.pending[len(self.pending) - keep:]
            return out

    def finish(self) -> Parsed:
        rest = (HERMES_OPEN if self.in_call else "") + self.pending  # an unclosed call stays text
        self.pending, self.in_call = "", False
        return Parsed(content=rest)


class Llama3JsonParser(ToolCallParser):
    """An answer that starts with `{` is held to the end and read as calls; any other streams as content."""

    def __init__(self) -> None:
        super().__init__()
        self.held: str | None = ""  # None: known to be content

    def feed(self, text: str) -> Parsed:
        if self.held is None:
            return Parsed(content=text)
        self.held += text
        stripped = self.held.lstrip()
        if stripped and not stripped.startswith("{"):
            content, self.held = self.held, None
            return Parsed(content=content)
        return Parsed()

    def finish(self) -> Parsed:
        held, self.held = self.held or "", None
        deltas = [self._call_from_json(part) for part in _json_objects(held)]
        if deltas and all(delta is not None for delta in deltas):
            return Parsed(deltas=deltas)  # type: ignore[arg-type]
        self.calls.clear()
        return Parsed(content=held)


class RequiredParser(ToolCallParser):
    """The grammar's JSON array of calls: each call is sent as soon as its object closes."""

    def __init__(self) -> None:
        super().__init__()
        self.item = ""  # the array item being written
        self.depth = 0
        self.in_string = self.escaped = False

    def feed(self, text: str) -> Parsed:
        out = Parsed()
        for char in text:
            if self.depth >= 2 or (self.depth == 1 and char == "{"):
                self.item += char
            if self.in_string:
                self.escaped, self.in_string = (False, True) if self.escaped else (char == "\\", char != '"')
            elif char == '"':
                self.in_string = True
            elif char in "[{":
                self.depth += 1
            elif char in "]}":
                self.depth -= 1
                if self.depth == 1 and char == "}":
                    delta = self._call_from_json(self.item)
                    if delta is not None:
                        out.deltas.append(delta)
                    self.item = ""
        return out


class NamedParser(ToolCallParser):
    """The grammar's arguments of the one function named: streamed as that call's arguments as they come."""

    calls_finish_reason = "stop"

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.arguments = ""  # all of them so far; the call's first delta brings its id and name

    def feed(self, text: str) -> Parsed:
        self.arguments += text
        if not self.calls:
            return Parsed(deltas=[self._call(self.name, text)])
        return Parsed(deltas=[{"index": 0, "function": {"arguments": text}}] if text else [])

    def finish(self) -> Parsed:
        out = self.feed("")  # a call even when no arguments came
        self.calls[0] = dataclasses.replace(self.calls[0], arguments=self.arguments)
        return out


def _json_objects(text: str) -> list[str]:
    """The JSON values of `text` written one after another, joined by ";" (Llama 3's parallel calls); [] when it
    is not that."""
    decoder, values, position = json.JSONDecoder(), [], 0
    text = text.strip()
    while position < len(text):
        try:
            _, end = decoder.raw_decode(text, position)
        except ValueError:
            return []
        values.append(text[position:end])
        position = end
        while position < len(text) and text[position] in " \t\n;":
            position += 1
    return values


def _tag_prefix_length(text: str, tag: str) -> int:
    """How many of text's last characters could start `tag` (held back until the next piece says)."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0


def parser_for_auto(fmt: ToolCallFormat) -> ToolCallParser:
    return HermesParser() if fmt == "hermes" else Llama3JsonParser()
