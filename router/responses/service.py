"""/v1/responses: a turn of a conversation served as a chat request through the same path (plugins,
scheduling, P/D), answered as a Response; with `store` (the default) kept for `previous_response_id` and
GET/DELETE /v1/responses/{id}."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from kvferry.router.admission.plugins import PluginChain
from kvferry.router.api.chat_stream import StreamWriter
from kvferry.router.api.completion_shapes import Choice, TokenUsage
from kvferry.router.api.errors import APIError
from kvferry.router.api.request_body import RequestCheck
from kvferry.router.responses.conversation import Message, answer_message, chat_request, input_messages
from kvferry.router.responses.output import ResponseDraft, incomplete_reason, new_id, output_items
from kvferry.router.responses.schema import ResponsesRequest
from kvferry.router.responses.store import ResponseStore, StoredResponse
from kvferry.router.responses.stream import ResponseEventWriter
from kvferry.router.service import CompletionService, Prepared


def not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(404 if param is None else 400, f"Response with id '{response_id}' not found.", param=param,
                    code="previous_response_not_found" if param else "not_found")


@dataclass(frozen=True)
class ResponseTurn:
    """One request's ResponseFormat (router/service.py): its draft, and the conversation its answer joins."""

    draft: ResponseDraft
    conversation: list[Message]  # before the answer: the earlier turns and this one's input
    session: str  # the conversation's prompt_cache_key
    store: ResponseStore
    count_tokens: Callable[[str], int]

    async def whole(self, prepared: Prepared, choices: list[Choice], usage: TokenUsage) -> dict[str, Any]:
        choice = choices[0]
        items = output_items(choice.reasoning, choice.text, choice.tool_calls)
        return await self.finish(items, choice.text, choice.reasoning, choice.tool_calls or [], choice.finish_reason,
                                 usage)

    def writer(self, prepared: Prepared, plugins: PluginChain) -> StreamWriter:
        parsers = prepared.parsers()
        return ResponseEventWriter(self.draft, parsers[0] if parsers else None, plugins, prepared.context, self.finish)

    async def finish(self, items: list[dict[str, Any]], text: str, reasoning: str | None,
                     tool_calls: list[dict[str, Any]], finish_reason: str | None, usage: TokenUsage) -> dict[str, Any]:
        """The whole response, stored when the request asked for that (the default)."""
        incomplete = incomplete_reason(finish_reason)
        body = self.draft.body("incomplete" if incomplete else "completed", items, usage,
                               self.count_tokens(reasoning) if reasoning else 0, incomplete)
        if self.draft.request.store:
            messages = [*self.conversation, answer_message(text, tool_calls or None)]
            try:
                await self.store.put(self.draft.id, StoredResponse(body, messages, self.session))
            except Exception as exc:  # noqa: BLE001 - Redis' errors are many; the client must learn it is not kept
                raise APIError(503, f"the response could not be stored: {exc!r}") from None
        return body


class ResponsesService:
    def __init__(self, completions: CompletionService, store: ResponseStore, check: RequestCheck,
                 count_tokens: Callable[[str], int]) -> None:
        self.completions, self.store, self.check, self.count_tokens = completions, store, check, count_tokens

    async def create(self, body: ResponsesRequest, request: Request) -> Response:
        self.check(body)
        draft = ResponseDraft(new_id("resp"), int(time.time()), self.completions.model, body)
        history: list[Message] = []
        session = body.prompt_cache_key or draft.id  # a new conversation is named by its first response
        if body.previous_response_id is not None:
            previous = await self._stored(body.previous_response_id, "previous_response_id")
            history, session = previous.messages, body.prompt_cache_key or previous.session
        turn = input_messages(body)
        chat = chat_request(body, history, turn, session)
        return await self.completions.serve(chat, request, ResponseTurn(draft, [*history, *turn], session, self.store,
                                                                        self.count_tokens))

    async def retrieve(self, response_id: str) -> JSONResponse:
        return JSONResponse((await self._stored(response_id)).body)

    async def delete(self, response_id: str) -> JSONResponse:
        if not await self.store.delete(response_id):
            raise not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    async def _stored(self, response_id: str, param: str | None = None) -> StoredResponse:
        stored = await self.store.get(response_id)
        if stored is None:
            raise not_found(response_id, param)
        return stored
