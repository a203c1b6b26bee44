"""A streamed response's typed events (OpenAI's: `event: <type>` and its JSON, numbered by sequence_number):
response.created, each output item added and done, the text, thinking and call arguments as deltas, and
response.completed (or .incomplete, .failed) with the whole response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from kvferry.router.admission.plugins import PluginChain, PluginContext
from kvferry.router.api.chat_stream import parsed_piece
from kvferry.router.api.completion_shapes import TokenUsage
from kvferry.router.api.errors import APIError
from kvferry.router.api.output_parser import OutputParser
from kvferry.router.api.parsed_output import Parsed
from kvferry.router.responses.output import (
    ResponseDraft,
    function_call_item,
    message_item,
    new_id,
    output_text,
    reasoning_item,
)

# The answer so far when the stream ends: (items, its text, its thinking or None, its calls, finish reason).
Finish = Callable[[list[dict[str, Any]], str, str | None, list[dict[str, Any]], str | None, TokenUsage],
                  Awaitable[dict[str, Any]]]


class ResponseEventWriter:
    def __init__(self, draft: ResponseDraft, parser: OutputParser | None, plugins: PluginChain, context: PluginContext,
                 finish: Finish) -> None:
        """`finish` makes (and stores) the whole response from the streamed answer."""
        self.draft, self.parser, self.plugins, self.context, self.finish = draft, parser, plugins, context, finish
        self.sequence = 0
        self.items: dict[int, dict[str, Any]] = {}  # done, by output index
        self.added = 0  # items added so far: the next one's output index
        self.open: dict[str, Any] | None = None  # the reasoning or message item being written
        self.open_index, self.open_text = 0, ""
        self.calls: list[dict[str, Any]] = []  # chat tool calls as they came, arguments accumulated
        self.call_items: dict[int, dict[str, Any]] = {}  # by the parser's call index: its item's id and output index
        self.text, self.reasoning, self.held = "", None, ""  # held: leading whitespace (a message only if more comes)
        self.finish_reason: str | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = orjson.dumps({"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def opening(self) -> bytes:
        snapshot = self.draft.body("in_progress", [])
        return self._event("response.created", response=snapshot) + self._event("response.in_progress", response=snapshot)

    def batch(self, index: int, chunks: list[dict[str, Any]]) -> bytes:
        events = []
        for chunk in chunks:
            text, finish = self.plugins.on_output(self.context, chunk["text"]), chunk["finish_reason"]
            parsed = Parsed(content=text)
            if self.parser is not None:
                parsed, finish = parsed_piece(self.parser, text, finish)
            self.finish_reason = finish or self.finish_reason
            if parsed.reasoning:
                events.append(self._thinking(parsed.reasoning))
            if parsed.content:
                events.append(self._text(parsed.content))
            events += [self._call(delta) for delta in parsed.deltas]
        return b"".join(events)

    def _thinking(self, piece: str) -> bytes:
        opened = self._open("reasoning")
        self.reasoning = (self.reasoning or "") + piece
        self.open_text += piece
        return opened + self._event("response.reasoning_text.delta", item_id=self.open["id"],  # type: ignore[index]
                                    output_index=self.open_index, content_index=0, delta=piece)

    def _text(self, piece: str) -> bytes:
        self.text += piece
        if (self.open is None or self.open["type"] != "message") and not (self.held + piece).strip():
            self.held += piece  # only whitespace yet: a message item if text follows
            return b""
        piece, self.held = self.held + piece, ""
        opened = self._open("message")
        self.open_text += piece
        return opened + self._event("response.output_text.delta", item_id=self.open["id"],  # type: ignore[index]
                                    output_index=self.open_index, content_index=0, delta=piece, logprobs=[])

    def _open(self, kind: str) -> bytes:
        """The item of `kind` open for more, the one open before closed."""
        if self.open is not None and self.open["type"] == kind:
            return b""
        closed = self._close()
        self.open = reasoning_item(new_id("rs"), "", "in_progress") if kind == "reasoning" else \
            message_item(new_id("msg"), None, "in_progress")
        self.open_index, self.added = self.added, self.added + 1
        added = self._event("response.output_item.added", output_index=self.open_index, item=self.open)
        if kind == "message":
            added += self._event("response.content_part.added", item_id=self.open["id"], output_index=self.open_index,
                                 content_index=0, part=output_text(""))
        return closed + added

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        item_id, index, text = self.open["id"], self.open_index, self.open_text
        if self.open["type"] == "reasoning":
            done = reasoning_item(item_id, text, "completed")
            events = self._event("response.reasoning_text.done", item_id=item_id, output_index=index, content_index=0,
                                 text=text)
        else:
            done = message_item(item_id, text, "completed")
            events = (self._event("response.output_text.done", item_id=item_id, output_index=index, content_index=0,
                                  text=text, logprobs=[])
                      + self._event("response.content_part.done", item_id=item_id, output_index=index, content_index=0,
                                    part=output_text(text)))
        self.items[index] = done
        self.open, self.open_text = None, ""
        return events + self._event("response.output_item.done", output_index=index, item=done)

    def _call(self, delta: dict[str, Any]) -> bytes:
        """A call's first delta (its id and name, and arguments so far) or more of its arguments."""
        arguments = delta["function"].get("arguments") or ""
        events = b""
        if "id" in delta:  # a new call: it follows whatever was being written
            events += self._close()
            self.calls.append({"id": delta["id"], "type": "function",
                               "function": {"name": delta["function"]["name"], "arguments": ""}})
            item = function_call_item(new_id("fc"), self.calls[-1], "", "in_progress")
            self.call_items[delta["index"]] = {"id": item["id"], "output_index": self.added}
            events += self._event("response.output_item.added", output_index=self.added, item=item)
            self.added += 1
        item = self.call_items[delta["index"]]
        self.calls[delta["index"]]["function"]["arguments"] += arguments
        if arguments:
            events += self._event("response.function_call_arguments.delta", item_id=item["id"],
                                  output_index=item["output_index"], delta=arguments)
        return events

    def _close_calls(self) -> bytes:
        events = b""
        for index, item in sorted(self.call_items.items()):
            arguments = self.calls[index]["function"]["arguments"]
            done = function_call_item(item["id"], self.calls[index], arguments, "completed")
            events += self._event("response.function_call_arguments.done", item_id=item["id"],
                                  output_index=item["output_index"], arguments=arguments)
            events += self._event("response.output_item.done", output_index=item["output_index"], item=done)
            self.items[item["output_index"]] = done
        return events

    async def closing(self, usage: TokenUsage) -> bytes:
        events = b""
        if self.open is None and not self.calls and not any(item["type"] == "message" for item in self.items.values()):
            events += self._open("message")  # an answer with no text is still a message, an empty one
            self.open_text, self.held = self.held, ""
        events += self._close() + self._close_calls()
        items = [self.items[index] for index in sorted(self.items)]
        body = await self.finish(items, self.text, self.reasoning, self.calls, self.finish_reason, usage)
        kind = "response.completed" if body["status"] == "completed" else f"response.{body['status']}"
        return events + self._event(kind, response=body)

    def failed(self, error: APIError) -> bytes:
        code = error.code or str(error.status)
        body = self.draft.body("failed", [self.items[index] for index in sorted(self.items)],
                               error={"code": code, "message": error.message})
        return (self._event("error", code=code, message=error.message, param=error.param)
                + self._event("response.failed", response=body))
