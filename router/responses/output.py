"""A response's body and its output items (reasoning, message, function calls), whole or as they stream."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

from kvferry.router.api.completion_shapes import TokenUsage
from kvferry.router.responses.schema import ResponsesRequest

Status = Literal["in_progress", "completed", "incomplete", "failed"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}],
            "status": status}


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    """`text` None: the message as it opens, before its content part."""
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [] if text is None else [output_text(text)]}


def function_call_item(item_id: str, call: dict[str, Any], arguments: str, status: str) -> dict[str, Any]:
    """`call`: a chat tool call ({"id", "function": {"name", ...}})."""
    return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": call["function"]["name"],
            "arguments": arguments, "status": status}


def output_items(reasoning: str | None, text: str, tool_calls: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A whole answer's items: its thinking, its text (unless it is only calls), its calls."""
    items = [reasoning_item(new_id("rs"), reasoning, "completed")] if reasoning is not None else []
    if text.strip() or not tool_calls:
        items.append(message_item(new_id("msg"), text, "completed"))
    items += [function_call_item(new_id("fc"), call, call["function"]["arguments"], "completed")
              for call in tool_calls or []]
    return items


def incomplete_reason(finish_reason: str | None) -> str | None:
    return "max_output_tokens" if finish_reason == "length" else None


@dataclass(frozen=True)
class ResponseDraft:
    """What a response says besides its output: known before the first token, so its stream can start."""

    id: str
    created_at: int
    model: str
    request: ResponsesRequest

    def body(self, status: Status, output: list[dict[str, Any]], usage: TokenUsage | None = None,
             reasoning_tokens: int = 0, incomplete: str | None = None,
             error: dict[str, Any] | None = None) -> dict[str, Any]:
        request = self.request
        text_format = request.text.format if request.text and request.text.format else None
        choice = request.tool_choice
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status, "model": self.model,
            "output": output, "instructions": request.instructions,
            "previous_response_id": request.previous_response_id, "store": request.store,
            "temperature": 1.0 if request.temperature is None else request.temperature,
            "top_p": 1.0 if request.top_p is None else request.top_p, "max_output_tokens": request.max_output_tokens,
            "tools": [tool.model_dump(exclude_none=True) for tool in request.tools or []],
            "tool_choice": choice.model_dump() if choice is not None and not isinstance(choice, str) else choice or "auto",
            "parallel_tool_calls": request.parallel_tool_calls,
            "text": {"format": text_format.model_dump(exclude_none=True, by_alias=True) if text_format else {"type": "text"}},
            "metadata": request.metadata or {}, "user": request.user, "prompt_cache_key": request.prompt_cache_key,
            "truncation": "disabled", "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "usage": usage.responses(reasoning_tokens) if usage else None,
        }
