"""A Responses request as the chat request the cluster serves: the instructions, the stored conversation of
`previous_response_id`, and the input items as chat messages; its tools, tool choice and text format in chat's
form. And the turn's answer as the chat message the next turn's prompt renders."""

from __future__ import annotations

from typing import Any

from kvferry.router.api.errors import APIError
from kvferry.router.api.openai_schema import ChatCompletionRequest
from kvferry.router.responses.schema import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputMessage,
    ReasoningItem,
    ResponsesRequest,
)

Message = dict[str, Any]  # a chat message as ChatCompletionRequest takes it


def input_messages(body: ResponsesRequest) -> list[Message]:
    """The turn's input as chat messages: an assistant's calls gathered into one message, as templates expect."""
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    messages: list[Message] = []
    for item in body.input:
        if isinstance(item, InputMessage):
            text = item.content if isinstance(item.content, str) else "".join(part.text or "" for part in item.content)
            messages.append({"role": item.role, "content": text})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        elif not isinstance(item, ReasoningItem):  # (reasoning passed back: left out, see schema.ReasoningItem)
            raise AssertionError(f"unhandled input item {item!r}")
    if not messages:
        raise APIError(400, "the input holds no message, call or call output", param="input")
    return messages


def chat_request(body: ResponsesRequest, history: list[Message], turn: list[Message], session: str) -> ChatCompletionRequest:
    """The chat request of a turn: `history` (the previous responses' conversation), then `turn` (its input);
    `session` names the conversation (its turns go where its KV is)."""
    instructions = [{"role": "system", "content": body.instructions}] if body.instructions else []
    fields: dict[str, Any] = {
        "model": body.model, "messages": [*instructions, *history, *turn], "stream": body.stream,
        "max_completion_tokens": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p,
        "parallel_tool_calls": body.parallel_tool_calls, "user": body.user, "prompt_cache_key": session,
    }
    if body.tools:
        fields["tools"] = [{"type": "function", "function": tool.model_dump(exclude={"type"}, exclude_none=True)}
                           for tool in body.tools]
    if body.tool_choice is not None:
        choice = body.tool_choice
        fields["tool_choice"] = choice if isinstance(choice, str) else {"type": "function",
                                                                         "function": {"name": choice.name}}
    text_format = body.text.format if body.text else None
    if text_format is not None and text_format.type == "json_schema":
        if text_format.schema_ is None or text_format.name is None:
            raise APIError(400, "a json_schema text format needs its name and schema", param="text.format")
        fields["response_format"] = {"type": "json_schema", "json_schema": {
            "name": text_format.name, "schema": text_format.schema_, "strict": text_format.strict}}
    elif text_format is not None and text_format.type == "json_object":
        fields["response_format"] = {"type": "json_object"}
    return ChatCompletionRequest.model_validate({key: value for key, value in fields.items() if value is not None})


def answer_message(text: str, tool_calls: list[dict[str, Any]] | None) -> Message:
    """The turn's answer in the conversation: its text and calls (its thinking left out, as templates do)."""
    message: Message = {"role": "assistant", "content": text if text or not tool_calls else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message
