"""The Responses API's request body, as much of it as the router serves (OpenAI's `responses.create`).
Fields it does not declare are kept to be named and refused (router/api/request_body.py), as elsewhere."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kvferry.router.api.openai_schema import FUNCTION_NAME, ContentPart, OpenBody


class InputContent(ContentPart):
    # input_text, output_text (an earlier answer passed back); anything else is refused by name
    text_types = ("input_text", "output_text")


class InputItemBase(OpenBody):
    id: str | None = None  # an output item passed back as input carries its id and status
    status: str | None = None


class InputMessage(InputItemBase):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputContent]


class FunctionCallItem(InputItemBase):
    """A call the model made, passed back as input (stateless clients send the whole conversation)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(InputItemBase):
    """A tool's result: the call it answers."""

    type: Literal["function_call_output"]
    call_id: str
    output: str


class ReasoningItem(InputItemBase):
    """An earlier thinking passed back: left out of the prompt, as chat templates leave past thinking out."""

    type: Literal["reasoning"]
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[dict[str, Any]] | None = None


InputItem = InputMessage | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class FunctionTool(OpenBody):
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(OpenBody):
    type: Literal["function"]
    name: str


class TextFormat(OpenBody):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(OpenBody):
    format: TextFormat | None = None


class ResponsesRequest(OpenBody):
    model: str
    input: str | list[InputItem]
    instructions: str | None = None  # a system message first; not carried on to the next turn (OpenAI's rule)
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    prompt_cache_key: str | None = None  # a conversation's key: its turns go where their KV is


class ResponseObject(BaseModel):
    """What comes back (documented for the OpenAPI schema; router/responses/output.py writes it)."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "failed", "in_progress"]
    model: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None
    error: dict[str, Any] | None
    incomplete_details: dict[str, Any] | None


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"]
    deleted: bool
