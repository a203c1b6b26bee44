"""OpenAI's request and response bodies, as much of them as the router serves. The request models are
the OpenAPI schema clients (and schemathesis) see; the response models document what comes back."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

# OpenAI's own bounds; the engine checks the rest again (kvferry.engine.SamplingParams).
MAX_N = 16
MAX_LOGPROBS = 20
MAX_INT32 = 2**31 - 1


class OpenBody(BaseModel):
    """A body part that keeps the fields it does not declare (model_extra): router/api/request_body.py names them, and
    the router refuses them (or logs them, `unsupported_fields: warn`) rather than dropping them unseen."""

    # Kept, to be named; the schema says what the router does by default: such a field is refused.
    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": False})


class StreamOptions(OpenBody):
    include_usage: bool = False


class JsonSchemaFormat(OpenBody):
    name: str = Field(max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None  # the output always fits the schema here, strict or not


class ResponseFormat(OpenBody):
    """OpenAI's: `text` (free), `json_object` (any JSON object) or `json_schema` (fitting the schema)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(OpenBody):
    """vLLM's `structured_outputs` extra field: exactly one of a JSON schema, a regex, or a list of choices."""

    json_: dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1)


class SamplingFields(OpenBody):
    model: str
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=MAX_INT32)  # (beyond any vocabulary; bounded for the sampler's tensors)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0, le=MAX_INT32)]] | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, ge=0.01, le=10.0)  # smaller ones overflow the logits
    ignore_eos: bool = False
    min_tokens: int | None = Field(None, ge=0, le=MAX_INT32)  # vLLM's: outputs before EOS or a stop may come
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # the end user, as the client names them: plugins see it (PluginContext.user)
    prompt_cache_key: str | None = None  # a conversation's name: its requests go where its KV is (sessions.py)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False  # the prompt's text before each choice's
    best_of: int | None = Field(None, ge=1, le=MAX_N)  # choices generated; the n most likely are returned


class ContentPart(OpenBody):
    text_types: ClassVar[tuple[str, ...]] = ("text",)  # kvferry takes text; other parts are refused by name

    type: str
    text: str | None = None


FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for a function's name


class FunctionDefinition(OpenBody):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments; none: any object
    strict: bool | None = None  # the arguments always fit the schema when a call is forced, strict or not


class Tool(OpenBody):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(OpenBody):
    name: str


class NamedToolChoice(OpenBody):
    type: Literal["function"]
    function: FunctionName


class FunctionCall(OpenBody):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(OpenBody):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(OpenBody):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's result: the call it answers

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(part.text or "" for part in self.content)  # text parts only (request_body.py refuses others)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None  # default: auto with tools
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # the template's variables (vLLM's): enable_thinking, ...


class TokenizeRequest(OpenBody):
    """vLLM's /tokenize: a prompt (text), or chat messages through the model's template."""

    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    tools: list[Tool] | None = None  # with messages: rendered as a chat request's are
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = True  # prompt: the tokenizer's BOS and the like (a template writes its own)


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(OpenBody):
    model: str
    tokens: list[Annotated[int, Field(ge=0, le=MAX_INT32)]]


class DetokenizeResponse(BaseModel):
    prompt: str


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class _Choice(BaseModel):
    index: int
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None
    token_ids: list[int] = Field(default_factory=list)  # beyond OpenAI: the generated token ids


class CompletionChoice(_Choice):
    text: str


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None  # None when the answer is tool calls alone
    tool_calls: list[ToolCall] | None = None


class ChatChoice(_Choice):
    message: AssistantMessage


class _Response(BaseModel):
    id: str
    created: int
    model: str
    usage: Usage | None = None


class CompletionResponse(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class ChatCompletionResponse(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kvferry"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
