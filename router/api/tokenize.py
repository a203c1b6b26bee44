"""/tokenize and /detokenize (vLLM's): the router's own tokenizer and chat template, the ones every request
goes through, so a client can count a prompt's tokens exactly as the router will."""

from __future__ import annotations

from kvferry.router.api.errors import APIError
from kvferry.router.api.openai_schema import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from kvferry.router.api.prompts import PromptEncoder
from kvferry.router.api.request_body import RequestCheck
from kvferry.router.api.tool_calls import template_messages, template_tools


class Tokenization:
    def __init__(self, encoder: PromptEncoder, check: RequestCheck) -> None:
        self.encoder, self.check = encoder, check

    def tokenize(self, body: TokenizeRequest) -> TokenizeResponse:
        self.check(body)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of prompt and messages", param="prompt")
        if body.messages is not None:
            tokens = self.encoder.chat(template_messages(body.messages), template_tools(body.tools or []),
                                       body.chat_template_kwargs).token_ids
        else:
            tokens = self.encoder.tokens(body.prompt or "", body.add_special_tokens)
        return TokenizeResponse(count=len(tokens), max_model_len=self.encoder.max_model_len, tokens=tokens)

    def detokenize(self, body: DetokenizeRequest) -> DetokenizeResponse:
        self.check(body)
        self.encoder.check_vocabulary(body.tokens, "tokens")
        return DetokenizeResponse(prompt=self.encoder.text(body.tokens))
