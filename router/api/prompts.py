"""From an OpenAI request to prompt token ids, with the model's tokenizer and chat template, and the
limits (context length, vocabulary) that decide a 400 before any node is called."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvferry.engine.tokenizer import ModelTokenizer, NoChatTemplateError
from kvferry.router.api.errors import APIError
from kvferry.router.api.output_parser import OutputForm
from kvferry.router.api.reasoning import template_thinks
from kvferry.router.api.tool_calls import tools_system_text
from kvferry.router.api.tool_parsers import ToolCallFormat

# Variables a request's chat_template_kwargs cannot set: the template gets them from the request itself.
RESERVED_TEMPLATE_VARIABLES = ("messages", "tools", "add_generation_prompt")
# The engine's own default cap (engine/llm_engine.py) when a node is not given --max-model-len.
ENGINE_MAX_MODEL_LEN = 8192


@dataclass(frozen=True)
class ModelLimits:
    max_model_len: int
    vocab_size: int

    @classmethod
    def from_dir(cls, model_dir: str | Path, max_model_len: int | None = None) -> ModelLimits:
        config = json.loads((Path(model_dir) / "config.json").read_text())
        context = min(ENGINE_MAX_MODEL_LEN, int(config.get("max_position_embeddings", ENGINE_MAX_MODEL_LEN)))
        return cls(max_model_len=max_model_len or context, vocab_size=int(config["vocab_size"]))


@dataclass(frozen=True)
class ChatPrompt:
    text: str  # as the template wrote it (where the output starts: inside a thinking block or not)
    token_ids: list[int]


class PromptEncoder:
    def __init__(self, model_dir: str | Path, limits: ModelLimits, chat_template: str | None = None) -> None:
        """`chat_template`: the template's source, instead of the model's own."""
        self.tokenizer = ModelTokenizer(model_dir, chat_template)
        self.limits = limits

    @property
    def max_model_len(self) -> int:
        return self.limits.max_model_len

    def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
             template_kwargs: dict[str, Any] | None = None) -> ChatPrompt:
        """With tools: rendered by the template where it renders them, else told in a system message.
        `template_kwargs`: the request's chat_template_kwargs (`enable_thinking`, ...), variables of the template."""
        reserved = sorted(set(template_kwargs or {}) & set(RESERVED_TEMPLATE_VARIABLES))
        if reserved:
            raise APIError(400, f"chat_template_kwargs cannot set {', '.join(reserved)}: the request's own fields do",
                           param="chat_template_kwargs")
        if tools:
            template = self.tokenizer.chat_template(with_tools=True)
            if template is not None and "tools" not in template:  # (none: the 400 below)
                messages = _with_system_text(messages, tools_system_text(tools))
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=tools or None, **(template_kwargs or {}))
        except NoChatTemplateError as exc:
            raise APIError(400, str(exc), param="messages") from None
        except Exception as exc:  # noqa: BLE001 - templates raise what they like on messages they refuse
            raise APIError(400, f"the chat template refused the messages: {exc}", param="messages") from None
        # The template writes the special tokens (BOS) itself.
        return ChatPrompt(text, self.check(self.tokenizer.encode(text, add_special_tokens=False)))

    def output_form(self, tool_calls: ToolCallFormat | None, thinks: bool | None) -> OutputForm:
        """How the model writes calls and thinking: as given (the router's settings), else read from its template.
        Calls: Llama 3's bare JSON where the template asks for that (it speaks of `<|python_tag|>` or `ipython`),
        else Hermes' `<tool_call>` tags (Qwen's, and the ones tools_system_text teaches a template without tools).
        Thinking: where the template writes `</think>`."""
        template = self.tokenizer.chat_template(with_tools=True) or ""
        if tool_calls is None:
            tool_calls = "llama3_json" if "<|python_tag|>" in template or "ipython" in template else "hermes"
        return OutputForm(tool_calls, template_thinks(self.tokenizer.chat_template()) if thinks is None else thinks)

    def completion(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str) and not prompt:
            # Refused although the tokenizer would add BOS: an empty prompt is almost always a client bug.
            raise APIError(400, "the prompt is empty: it must hold at least one character", param="prompt")
        return self.check(self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt))

    def tokens(self, text: str, add_special_tokens: bool) -> list[int]:
        """A text's tokens as they are, none required (/tokenize counts an empty one as 0)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def check(self, token_ids: list[int]) -> list[int]:
        if not token_ids:
            raise APIError(400, "the prompt is empty: it must hold at least one token", param="prompt")
        self.check_vocabulary(token_ids, "prompt")
        return token_ids

    def check_vocabulary(self, token_ids: list[int], param: str) -> None:
        vocab = self.limits.vocab_size
        if any(not 0 <= token < vocab for token in token_ids):
            raise APIError(400, f"token ids outside the vocabulary [0, {vocab}) in {param}", param=param)

    def max_tokens(self, prompt_len: int, requested: int | None, max_model_len: int) -> int:
        """The completion's budget: the request's, else the rest of the context; 400 when it does not fit."""
        if requested is None:
            requested = max_model_len - prompt_len
        if prompt_len + requested > max_model_len or requested < 1:
            raise APIError(
                400,
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{prompt_len + max(requested, 1)} tokens ({prompt_len} in the prompt, {max(requested, 1)} in the "
                "completion). Please reduce the prompt or the completion length.",
                param="max_tokens", code="context_length_exceeded",
            )
        return requested

    def text(self, token_ids: list[int]) -> str:
        """A token prompt as text (echo), special tokens left out as the nodes leave them out of outputs."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


def _with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """`text` first in the system message, or in a new one before the rest."""
    if messages and messages[0]["role"] in ("system", "developer") and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
