"""OpenAI's response shapes from the nodes' stream chunks: whole responses, SSE chunks, logprobs, and the
token counts `usage` says in every API shape."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from kvferry.router.api.output_parser import OutputParser

Kind = Literal["chat", "completion"]
_TEXT_MARK = "\x00text\x00"  # where a template's text goes: no id, model name or number encodes to it
TokenText = Callable[[int], str]


@dataclass(frozen=True)
class TokenUsage:
    prompt_tokens: int  # every prompt's, once
    completion_tokens: int  # every choice's, the best_of ones left out too (each was computed)
    cached_tokens: int  # prompt tokens no node computed for this request: their KV was in a prefix cache

    def chat(self) -> dict[str, Any]:
        """Completions' and chat's `usage`."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def responses(self, reasoning_tokens: int) -> dict[str, Any]:
        """The Responses API's `usage`."""
        return {"input_tokens": self.prompt_tokens, "input_tokens_details": {"cached_tokens": self.cached_tokens},
                "output_tokens": self.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                "total_tokens": self.prompt_tokens + self.completion_tokens}


class UsageTally:
    """Counts a request's node chunks. A choice's first line says how much of its prompt was cached (a migrated
    stream's next node says it again: the first counts); the choices of one prompt share it, so each prompt
    counts its best choice's."""

    def __init__(self, prompt_tokens: int, num_choices: int, choices_per_prompt: int) -> None:
        self.prompt_tokens, self.per_prompt = prompt_tokens, choices_per_prompt
        self.completion_tokens = 0
        self.cached: list[int | None] = [None] * num_choices

    def add(self, index: int, chunks: list[dict[str, Any]]) -> None:
        for chunk in chunks:
            self.completion_tokens += len(chunk["token_ids"])
        if self.cached[index] is None and chunks and chunks[0].get("cached_tokens") is not None:
            self.cached[index] = chunks[0]["cached_tokens"]

    def usage(self) -> TokenUsage:
        per_prompt = [self.cached[start:start + self.per_prompt] for start in range(0, len(self.cached), self.per_prompt)]
        cached = sum(max((count or 0 for count in group), default=0) for group in per_prompt)
        return TokenUsage(self.prompt_tokens, self.completion_tokens, cached)


def sse(data: dict[str, Any] | str) -> bytes:
    # orjson: one event per token of every stream, and it takes ~1 us per chunk where json.dumps took ~10.
    # It writes UTF-8 rather than \u escapes (the same JSON), and null for a -inf logprob (-Infinity is not JSON).
    payload = data.encode() if isinstance(data, str) else orjson.dumps(data)
    return b"data: " + payload + b"\n\n"


def _sampled_and_top(entry: dict[str, float], token_id: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    # Node chunks carry {token_id: logprob} (string keys after JSON) for the sampled token and the top ones.
    values = {int(key): value for key, value in entry.items()}
    ranked = sorted(values.items(), key=lambda item: -item[1])[:top]
    return values.get(token_id, float("-inf")), ranked


def completion_logprobs(token_ids: list[int], entries: list[dict[str, float]], top: int, token_text: TokenText,
                        offset: int) -> dict[str, Any]:
    tokens, sampled, tops, offsets = [], [], [], []
    for token_id, entry in zip(token_ids, entries, strict=False):
        logprob, ranked = _sampled_and_top(entry, token_id, top)
        text = token_text(token_id)
        tokens.append(text)
        sampled.append(logprob)
        tops.append({token_text(t): v for t, v in ranked})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": sampled, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(token_ids: list[int], entries: list[dict[str, float]], top: int, token_text: TokenText) -> dict[str, Any]:
    def item(token_id: int, logprob: float) -> dict[str, Any]:
        text = token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = []
    for token_id, entry in zip(token_ids, entries, strict=False):
        logprob, ranked = _sampled_and_top(entry, token_id, top)
        content.append({**item(token_id, logprob), "top_logprobs": [item(t, v) for t, v in ranked]})
    return {"content": content}


@dataclass
class Choice:
    """One choice's accumulated output."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[str, float]] = field(default_factory=list)
    finish_reason: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # chat with tools: the calls found in the text
    reasoning: str | None = None  # a thinking model's: its thinking, apart from the answer in `text`

    def split(self, parser: OutputParser) -> None:
        """The whole output read by `parser`: the thinking and the calls out of the text, and the finish reason
        the calls make."""
        parsed = parser.feed(self.text)
        parsed += parser.finish()
        self.text = parsed.content
        self.reasoning = parser.reasoning_content(parsed.reasoning)
        self.tool_calls = [call.as_dict() for call in parser.calls] or None
        self.finish_reason = parser.finish_reason(self.finish_reason)


@dataclass(frozen=True)
class ResponseShape:
    """Everything the formatting of one request's responses needs besides the chunks."""

    kind: Kind
    request_id: str
    created: int
    model: str
    logprobs: int | None  # top alternatives per token; None: no logprobs
    token_text: TokenText
    # text_event's (head, tail) bytes per (choice, with_usage_field)
    _templates: dict[tuple[int, bool], tuple[bytes, bytes]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def object_name(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def _logprobs(self, token_ids: list[int], entries: list[dict[str, float]] | None, offset: int) -> dict | None:
        if self.logprobs is None or entries is None:
            return None
        if self.kind == "chat":
            return chat_logprobs(token_ids, entries, self.logprobs, self.token_text)
        return completion_logprobs(token_ids, entries, self.logprobs, self.token_text, offset)

    def whole(self, choices: list[Choice], usage: TokenUsage) -> dict[str, Any]:
        rendered = []
        for choice in choices:
            logprobs = self._logprobs(choice.token_ids, choice.logprobs, 0)
            body: dict[str, Any] = {"index": choice.index, "finish_reason": choice.finish_reason, "logprobs": logprobs}
            if self.kind == "chat":
                body["message"] = message = {"role": "assistant", "content": choice.text}
                if choice.tool_calls:  # OpenAI's: no content but the calls, unless there is text
                    message["content"] = choice.text if choice.text.strip() else None
                    message["tool_calls"] = choice.tool_calls
                if choice.reasoning is not None:
                    message["reasoning_content"] = choice.reasoning
            else:
                body["text"] = choice.text
            body["token_ids"] = choice.token_ids  # beyond OpenAI: tests compare tokens exactly
            rendered.append(body)
        return {"id": self.request_id, "object": self.object_name, "created": self.created, "model": self.model,
                "choices": rendered, "usage": usage.chat()}

    def chunk(self, choices: list[dict[str, Any]], with_usage_field: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"id": self.request_id, "object": f"{self.object_name}.chunk" if self.kind == "chat"
                                else "text_completion", "created": self.created, "model": self.model, "choices": choices}
        if with_usage_field:
            body["usage"] = None
        return body

    def role_delta(self, index: int) -> dict[str, Any]:
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}

    def tool_calls_delta(self, index: int, calls: list[dict[str, Any]]) -> dict[str, Any]:
        return {"index": index, "delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": None}

    def reasoning_delta(self, index: int, text: str) -> dict[str, Any]:
        return {"index": index, "delta": {"reasoning_content": text}, "logprobs": None, "finish_reason": None}

    def delta(self, index: int, text: str, token_ids: list[int], entries: list[dict[str, float]] | None,
              finish_reason: str | None, offset: int) -> dict[str, Any]:
        logprobs = self._logprobs(token_ids, entries, offset)
        if self.kind == "chat":
            delta = {"content": text} if text or finish_reason is None else {}
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def text_event(self, index: int, text: str, with_usage_field: bool) -> bytes:
        """The SSE event of a delta with text and nothing else (no finish reason, no logprobs asked for): what
        sse(chunk([delta(...)])) writes, byte for byte, from a template made once per choice, so that a token
        costs one JSON string encoding instead of building and encoding the chunk's dicts."""
        template = self._templates.get((index, with_usage_field))
        if template is None:
            whole = sse(self.chunk([self.delta(index, _TEXT_MARK, [], None, None, 0)], with_usage_field))
            head, _, tail = whole.partition(orjson.dumps(_TEXT_MARK))
            template = self._templates[(index, with_usage_field)] = (head, tail)
        return template[0] + orjson.dumps(text) + template[1]

    def usage_chunk(self, usage: TokenUsage) -> dict[str, Any]:
        return {**self.chunk([], with_usage_field=False), "usage": usage.chat()}
