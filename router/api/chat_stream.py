"""The SSE bytes of a streamed completion or chat completion, from the nodes' chunks: OpenAI's chunks, the
role first, each choice's text (its thinking and tool calls apart, where its parser splits them), the usage
chunk with `include_usage`, and `data: [DONE]`."""

from __future__ import annotations

from typing import Any, Protocol

from kvferry.router.admission.plugins import PluginChain, PluginContext
from kvferry.router.api.completion_shapes import ResponseShape, TokenUsage, sse
from kvferry.router.api.errors import APIError
from kvferry.router.api.output_parser import OutputParser
from kvferry.router.api.parsed_output import Parsed


class StreamWriter(Protocol):
    """One streamed response's bytes: its opening, each batch of a choice's node chunks, and its end."""

    def opening(self) -> bytes: ...

    def batch(self, index: int, chunks: list[dict[str, Any]]) -> bytes: ...

    async def closing(self, usage: TokenUsage) -> bytes: ...

    def failed(self, error: APIError) -> bytes: ...


def parsed_piece(parser: OutputParser, text: str, finish: str | None) -> tuple[Parsed, str | None]:
    """A chunk's text through its choice's parser, and the finish reason the parse makes of the node's."""
    parsed = parser.feed(text)
    if finish is not None:
        parsed += parser.finish()
        finish = parser.finish_reason(finish)
    return parsed, finish


class ChatEventWriter:
    def __init__(self, shape: ResponseShape, plugins: PluginChain, context: PluginContext, num_choices: int,
                 include_usage: bool, parsers: list[OutputParser] | None, echoes: list[str] | None) -> None:
        self.shape, self.plugins, self.context, self.include_usage = shape, plugins, context, include_usage
        self.num_choices = num_choices
        self.parsers = parsers  # per choice: what is thinking, what is content and what is a call
        self.echoes = echoes  # completions' echo: each choice's prompt text, sent first
        self.offsets = [0] * num_choices  # text sent per choice (completion logprobs' text_offset)

    def opening(self) -> bytes:
        shape, with_usage = self.shape, self.include_usage
        events = []
        if shape.kind == "chat":
            events += [sse(shape.chunk([shape.role_delta(index)], with_usage)) for index in range(self.num_choices)]
        if self.echoes is not None:  # each choice starts with its prompt (no logprobs: service._echoes)
            events += [shape.text_event(index, text, with_usage) for index, text in enumerate(self.echoes)]
        return b"".join(events)

    def batch(self, index: int, chunks: list[dict[str, Any]]) -> bytes:
        shape, with_usage = self.shape, self.include_usage
        events = []
        for chunk in chunks:
            text = self.plugins.on_output(self.context, chunk["text"])
            finish = chunk["finish_reason"]
            if self.parsers is not None:
                parsed, finish = parsed_piece(self.parsers[index], text, finish)
                text = parsed.content
                if parsed.reasoning:
                    events.append(sse(shape.chunk([shape.reasoning_delta(index, parsed.reasoning)], with_usage)))
                if parsed.deltas:
                    events.append(sse(shape.chunk([shape.tool_calls_delta(index, parsed.deltas)], with_usage)))
                if not text and finish is None and shape.logprobs is None:
                    continue  # held back: perhaps a tag, or sent as thinking or calls
            if finish is None and shape.logprobs is None:  # nearly every token: from a template
                events.append(shape.text_event(index, text, with_usage))
            elif shape.kind == "chat" and finish is not None and text:  # OpenAI ends a choice with an empty delta
                events.append(sse(shape.chunk([shape.delta(index, text, chunk["token_ids"], chunk.get("logprobs"), None,
                                                            self.offsets[index])], with_usage)))
                events.append(sse(shape.chunk([shape.delta(index, "", [], None if shape.logprobs is None else [], finish,
                                                            0)], with_usage)))
            else:
                events.append(sse(shape.chunk([shape.delta(index, text, chunk["token_ids"], chunk.get("logprobs"), finish,
                                                            self.offsets[index])], with_usage)))
            self.offsets[index] += len(text)
        return b"".join(events)

    async def closing(self, usage: TokenUsage) -> bytes:
        return (sse(self.shape.usage_chunk(usage)) if self.include_usage else b"") + sse("[DONE]")

    def failed(self, error: APIError) -> bytes:
        """The stream is open: the error goes in-band, as OpenAI sends it."""
        return sse(error.body()) + sse("[DONE]")
