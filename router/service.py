"""One OpenAI request end to end, stage after stage: the API (plugins, tokenization, limits), scheduling (one
prefix lookup per prompt, then a decision per choice), dispatch (the P/D flow of each choice), and the
response (whole or SSE), with its metrics."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from fastapi.responses import JSONResponse, Response
from opentelemetry import trace
from starlette.requests import Request

from kvferry import tracing
from kvferry.closing_response import ClosingStreamingResponse
from kvferry.internal_api import SamplingSpec
from kvferry.router.admission.limit import Admission
from kvferry.router.admission.plugins import PluginChain, PluginContext
from kvferry.router.api.best_of import most_likely
from kvferry.router.api.chat_stream import ChatEventWriter, StreamWriter
from kvferry.router.api.completion_shapes import Choice, ResponseShape, TokenUsage, UsageTally
from kvferry.router.api.disconnect import ClientDisconnected, until_disconnected
from kvferry.router.api.errors import APIError, overloaded
from kvferry.router.api.openai_schema import (
    ChatCompletionRequest,
    CompletionRequest,
)
from kvferry.router.api.output_parser import ChoiceSplit, OutputForm, OutputParser
from kvferry.router.api.prompts import PromptEncoder
from kvferry.router.api.reasoning import thinking_open
from kvferry.router.api.request_body import RequestCheck, sampling_spec
from kvferry.router.api.streams import merge_streams
from kvferry.router.api.tool_calls import ToolUse, template_messages
from kvferry.router.discovery.cluster import ClusterState
from kvferry.router.discovery.nodes import NodeView
from kvferry.router.dispatch.migration import Migration
from kvferry.router.metrics import RouterMetrics, ttft_phases
from kvferry.router.scheduling import Decision, NoNodeAvailable, Scheduler, SchedulingRequest
from kvferry.router.scheduling.prefix_lookup import PrefixLookup
from kvferry.router.scheduling.sessions import SessionAffinity

MAX_CHOICES = 64  # prompts x n in one request: each is its own node request
# One line per finished request at INFO (kvferry/logs.py: --log-level info), with its id, tokens and timings.
request_log = logging.getLogger("kvferry.router.requests")
CLIENT_LEFT = 499  # nginx's status for a client that closed the connection first


@dataclass(frozen=True)
class Prepared:
    """A request ready for the nodes: its choices, and what shapes their answer."""

    shape: ResponseShape
    prompt_tokens: int  # of every prompt, for usage
    subs: list[SubRequest]
    context: PluginContext
    echoes: list[str] | None  # echo: the prompt's text, per generated choice
    num_prompts: int
    returned_per_prompt: int  # n; fewer than generated with best_of
    split: ChoiceSplit | None  # chat: what each choice's output is split into (thinking, tool calls)
    session: str | None  # its conversation, if it names one (router/scheduling/sessions.py)

    def tally(self) -> UsageTally:
        return UsageTally(self.prompt_tokens, len(self.subs), len(self.subs) // self.num_prompts)

    def parsers(self) -> list[OutputParser] | None:
        """One per choice, None when nothing is split."""
        if self.split is None or not self.split.splits:
            return None
        return [self.split.parser() for _ in self.subs]


@dataclass(frozen=True)
class SubRequest:
    """One choice: the nodes' stream serves n == 1, so n choices (and each prompt of a batch) go separately."""

    choice: int
    prompt_index: int
    prompt_ids: list[int]
    spec: SamplingSpec


class CompletionService:
    def __init__(self, *, model: str, encoder: PromptEncoder, cluster: ClusterState, lookup: PrefixLookup,
                 scheduler: Scheduler, migration: Migration, metrics: RouterMetrics, plugins: PluginChain,
                 admission: Admission, default_max_tokens: int | None, check: RequestCheck,
                 output_form: OutputForm, sessions: SessionAffinity) -> None:
        self.model, self.encoder, self.cluster, self.scheduler = model, encoder, cluster, scheduler
        self.lookup, self.migration, self.metrics, self.plugins = lookup, migration, metrics, plugins
        self.admission, self.default_max_tokens, self.check = admission, default_max_tokens, check
        self.output_form, self.sessions = output_form, sessions

    async def serve(self, body: CompletionRequest | ChatCompletionRequest, request: Request,
                    fmt: ResponseFormat | None = None) -> Response:
        """`fmt`: how the answer is written; default the body's own API (completions or chat)."""
        clock = _TokenClock(self.metrics, time.perf_counter())
        prompt_tokens = None
        with tracing.phase("admission"):
            self.check(body)
            self.admission.enter()
        fmt = fmt or ChatFormat(bool(body.stream and body.stream_options and body.stream_options.include_usage))
        streaming, status, error = False, 500, None
        dispatch = trace.INVALID_SPAN  # the span of the nodes' work, from the first call to the last token
        try:
            with tracing.phase("tokenize"):
                prepared = self._prepare(body)
            prompt_tokens = prepared.prompt_tokens
            with tracing.phase("schedule"):
                decisions = await self._schedule_choices(prepared.subs, prepared.session)
            dispatch = tracing.tracer().start_span("dispatch")
            clock.dispatched = time.perf_counter()
            merged = merge_streams([self.migration.stream(f"{uuid.uuid4().hex}-{sub.choice}", sub.prompt_ids, sub.spec,
                                                          decision, self._reschedule, dispatch)
                                    for sub, decision in zip(prepared.subs, decisions, strict=True)])
            if body.stream:
                first = await until_disconnected(request, self._first(merged))
                streaming = True
                events = self._sse(prepared, merged, first, fmt.writer(prepared, self.plugins), clock, dispatch)
                await anext(events)  # started: from here on, closing it runs its cleanup
                return ClosingStreamingResponse(events, media_type="text/event-stream")
            choices, usage = await until_disconnected(request, self._collect(prepared, merged, clock))
            whole = await fmt.whole(prepared, choices, usage)
            status = 200
            return JSONResponse(whole)
        except ClientDisconnected:
            status = CLIENT_LEFT
            return Response(status_code=CLIENT_LEFT)  # nobody reads it
        except APIError as exc:
            status, error = exc.status, exc.message
            raise
        finally:
            if not streaming:
                self.admission.leave()
                self._finished(status, error, clock, prompt_tokens, stream=False, dispatch=dispatch)

    async def _collect(self, prepared: Prepared, merged: AsyncIterator[tuple[int, list[dict]]],
                       clock: _TokenClock) -> tuple[list[Choice], TokenUsage]:
        """Every choice's whole output (plugins, echo and the split applied; best_of's best), and the usage."""
        context = prepared.context
        choices = [Choice(index) for index in range(len(prepared.subs))]
        tally = prepared.tally()
        try:
            async for index, batch in merged:
                clock.tick(index, batch)
                tally.add(index, batch)
                choice = choices[index]
                for chunk in batch:
                    choice.text += chunk["text"]
                    choice.token_ids += chunk["token_ids"]
                    choice.logprobs += chunk.get("logprobs") or []
                    choice.finish_reason = chunk["finish_reason"] or choice.finish_reason
        finally:
            clock.flush()
        for choice in choices:
            choice.text = self.plugins.on_output(context, choice.text)
            if prepared.echoes is not None:
                choice.text = prepared.echoes[choice.index] + choice.text
        for choice, parser in zip(choices, prepared.parsers() or [], strict=False):
            choice.split(parser)
        clock.done()
        generated = len(choices) // prepared.num_prompts
        if generated > prepared.returned_per_prompt:
            choices = most_likely(choices, generated, prepared.returned_per_prompt)
        return choices, tally.usage()

    def _prepare(self, body: CompletionRequest | ChatCompletionRequest) -> Prepared:
        echoes, split, tool_use = None, None, None
        if isinstance(body, ChatCompletionRequest):
            tool_use = ToolUse.of(body, self.output_form.tool_calls)
            context = PluginContext("chat", body.model, messages=template_messages(body.messages), user=body.user)
            self.plugins.on_request(context)
            prompt = self.encoder.chat(context.messages or [], tool_use.template_tools() if tool_use else None,
                                       body.chat_template_kwargs)
            context.prompt_token_ids = [prompt.token_ids]
            split = ChoiceSplit(tool_use, thinking_open(prompt.text) if self.output_form.thinks else None)
            requested = body.max_completion_tokens or body.max_tokens or self.default_max_tokens
            logprobs = (body.top_logprobs or 0) if body.logprobs else None
            generated = body.n
        else:
            prompts = [body.prompt] if isinstance(body.prompt, str) or _is_token_list(body.prompt) else list(body.prompt)
            if not prompts:
                raise APIError(400, "the prompt list is empty", param="prompt")
            context = PluginContext("completion", body.model, prompts=prompts, user=body.user)  # type: ignore[arg-type]
            self.plugins.on_request(context)
            context.prompt_token_ids = [self.encoder.completion(p) for p in context.prompts or []]
            requested, logprobs = body.max_tokens, body.logprobs
            generated = _generated_per_prompt(body)
            if body.echo:
                echoes = self._echoes(body, context, generated)
        self.plugins.on_tokens(context)
        prompt_ids = [self.encoder.check(ids) for ids in context.prompt_token_ids]
        max_model_len = min([self.encoder.max_model_len]
                            + [n.max_model_len for n in self.cluster.views() if n.max_model_len])
        if len(prompt_ids) * generated > MAX_CHOICES:
            raise APIError(400, f"{len(prompt_ids)} prompts x {generated} choices each is more than {MAX_CHOICES}",
                           param="best_of" if generated > body.n else "n")
        # best_of ranks its choices by their tokens' logprobs: the sampled token's at least (0 alternatives).
        node_logprobs = (logprobs or 0) if generated > body.n else logprobs
        subs = []
        for prompt_index, ids in enumerate(prompt_ids):
            spec = sampling_spec(body, self.encoder.max_tokens(len(ids), requested, max_model_len), node_logprobs,
                                 tool_use.grammar() if tool_use else None)
            for j in range(generated):
                # A seeded request's choices differ from each other and repeat from run to run, as the
                # engine seeds its own n > 1 sequences (seed + index); unseeded choices must differ too.
                seed = spec.seed + j if spec.seed is not None else (random.getrandbits(62) if generated > 1 else None)
                subs.append(SubRequest(prompt_index * generated + j, prompt_index, ids, spec.model_copy(update={"seed": seed})))
        kind = "chat" if isinstance(body, ChatCompletionRequest) else "completion"
        shape = ResponseShape(kind, f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}", int(time.time()),
                              self.model, logprobs, self.encoder.token_text)
        return Prepared(shape, sum(len(ids) for ids in prompt_ids), subs, context, echoes, len(prompt_ids), body.n,
                        split, _session_of(body))

    def _echoes(self, body: CompletionRequest, context: PluginContext, generated: int) -> list[str]:
        """Each generated choice's prompt text: the prompt as given (after plugins), a token prompt decoded."""
        if body.logprobs is not None:
            raise APIError(400, "echo with logprobs needs the prompt's logprobs, which kvferry does not compute",
                           param="echo")
        texts = [p if isinstance(p, str) else self.encoder.text(ids)
                 for p, ids in zip(context.prompts or [], context.prompt_token_ids or [], strict=True)]
        return [text for text in texts for _ in range(generated)]

    async def _schedule_choices(self, subs: list[SubRequest], session: str | None) -> list[Decision]:
        """Where each choice goes (one prefix lookup per prompt). A session's choices go where its last turn
        went, while those nodes can take them; where they go is its next turn's preference. Each choice is
        scheduled on the nodes' load as of then, after the awaited lookup: what was scheduled meanwhile counts."""
        requests: dict[int, SchedulingRequest] = {}
        decisions = []
        for sub in subs:
            if sub.prompt_index not in requests:
                request = await self.lookup.request_for(sub.prompt_ids, self.cluster.views())
                if session is not None:
                    request = dataclasses.replace(request, session_nodes=self.sessions.nodes(session))
                requests[sub.prompt_index] = request
            decision = self._schedule(requests[sub.prompt_index], self.cluster.views(), len(sub.prompt_ids))
            if session is not None:
                self.sessions.record(session, frozenset(node.name for node in (decision.prefill, decision.decode) if node))
            decisions.append(decision)
        return decisions

    def _schedule(self, request: SchedulingRequest, nodes: list[NodeView], num_tokens: int) -> Decision:
        try:
            decision = self.scheduler.schedule(request, nodes)
        except NoNodeAvailable as exc:
            raise overloaded(503, str(exc)) from None
        self.lookup.routed(request, (decision.prefill or decision.decode).name)
        for node in (decision.decode, decision.prefill):
            if node is not None:
                self.cluster.schedule(node.url)
        policy = self.scheduler.policy_name
        self.metrics.routed(policy, "decode", decision.decode.name)
        if decision.prefill is not None:
            self.metrics.routed(policy, "prefill", decision.prefill.name)
        self.metrics.prefix(num_tokens, min(decision.cached_blocks * request.block_size, num_tokens))
        return decision

    async def _reschedule(self, token_ids: list[int], lost: set[str], last: NodeView | None) -> Decision:
        """A choice whose decode node was lost, scheduled again without the nodes it lost, on a decode node
        that runs the last one's model (`last`; None: the choice has no output yet, any model may start it):
        `token_ids`, its prompt and the outputs it has, are the prompt its next node computes."""
        def usable() -> list[NodeView]:
            return [node for node in self.cluster.views() if node.url not in lost and
                    (node.role != "decode" or last is None or node.exchanges_kv_with(last))]

        request = await self.lookup.request_for(token_ids, usable())
        return self._schedule(request, usable(), len(token_ids))

    @staticmethod
    async def _first(merged: AsyncIterator[tuple[int, list[dict]]]) -> tuple[int, list[dict]] | None:
        """The first batch, read before the response starts, so that refusals still get their status."""
        try:
            return await anext(merged)
        except StopAsyncIteration:
            return None

    async def _sse(self, prepared: Prepared, merged: AsyncIterator[tuple[int, list[dict]]],
                   first: tuple[int, list[dict]] | None, writer: StreamWriter, clock: _TokenClock,
                   dispatch: trace.Span) -> AsyncIterator[bytes]:
        status, error = 200, None
        tally = prepared.tally()
        try:
            async with contextlib.aclosing(merged):  # type: ignore[type-var]
                # Primed by serve(): a generator closed before it started would skip this cleanup (the admission
                # slot and the node streams would stay held when a client leaves before any byte).
                yield b""
                yield writer.opening()
                if first is not None:
                    clock.tick(*first)
                    tally.add(*first)
                    yield writer.batch(*first)
                # One write per batch: the chunks of a stream that arrived together leave together.
                async for index, batch in merged:
                    clock.tick(index, batch)
                    tally.add(index, batch)
                    yield writer.batch(index, batch)
            clock.done()
            yield await writer.closing(tally.usage())
        except APIError as exc:  # the stream is open: report in-band
            status, error = exc.status, exc.message
            yield writer.failed(exc)
        finally:
            clock.flush()
            self.admission.leave()
            self._finished(status if status != 200 or clock.finished else CLIENT_LEFT, error, clock,
                           prepared.prompt_tokens, stream=True, dispatch=dispatch)

    def _finished(self, status: int, error: str | None, clock: _TokenClock, prompt_tokens: int | None, stream: bool,
                  dispatch: trace.Span) -> None:
        """`error`: what the client was told, for a request that failed with an APIError."""
        self.metrics.request_done(status, clock.tokens)
        dispatch.end()
        tracing.set_attributes({"gen_ai.usage.output_tokens": clock.tokens, "kvferry.stream": stream,
                                **({"gen_ai.usage.input_tokens": prompt_tokens} if prompt_tokens is not None else {})})
        # A request the cluster failed (5xx) is logged at the default level too, with what the client was told:
        # it is what an operator looks for after an error, and what a failed test's diagnosis shows.
        level = logging.WARNING if status >= 500 else logging.INFO
        if request_log.isEnabledFor(level):
            fields = {"status": status, "stream": stream, "prompt_tokens": prompt_tokens, **clock.summary()}
            request_log.log(level, "request finished", extra={"fields": {**fields, **({"error": error} if error else {})}})


class ResponseFormat(Protocol):
    """How a request's answer is written: completions' and chat's (ChatFormat), or the Responses API's."""

    async def whole(self, prepared: Prepared, choices: list[Choice], usage: TokenUsage) -> dict[str, Any]: ...

    def writer(self, prepared: Prepared, plugins: PluginChain) -> StreamWriter: ...


@dataclass(frozen=True)
class ChatFormat:
    include_usage: bool  # stream_options.include_usage

    async def whole(self, prepared: Prepared, choices: list[Choice], usage: TokenUsage) -> dict[str, Any]:
        return prepared.shape.whole(choices, usage)

    def writer(self, prepared: Prepared, plugins: PluginChain) -> StreamWriter:
        return ChatEventWriter(prepared.shape, plugins, prepared.context, len(prepared.subs), self.include_usage,
                               prepared.parsers(), prepared.echoes)


def _session_of(body: CompletionRequest | ChatCompletionRequest) -> str | None:
    """The conversation a request names (router/scheduling/sessions.py): its prompt_cache_key, else its user."""
    if body.prompt_cache_key:
        return f"key:{body.prompt_cache_key}"
    return f"user:{body.user}" if body.user else None


def _generated_per_prompt(body: CompletionRequest) -> int:
    """n, or best_of: OpenAI's rules for it (at least n, never streamed)."""
    if body.best_of is None:
        return body.n
    if body.best_of < body.n:
        raise APIError(400, f"best_of ({body.best_of}) must be at least n ({body.n})", param="best_of")
    if body.stream and body.best_of > body.n:
        raise APIError(400, "best_of cannot be streamed: the best choices are known only at the end", param="best_of")
    return body.best_of


def _is_token_list(prompt: object) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(isinstance(token, int) for token in prompt)


class _TokenClock:
    """TTFT, inter-token and end-to-end latency of one request, into the histograms. The gaps go in at the
    end, in one call (a histogram observation per token cost the router measurable CPU per token)."""

    def __init__(self, metrics: RouterMetrics, arrived: float) -> None:
        self.metrics, self.arrived = metrics, arrived
        self.dispatched = arrived  # when the first node call went out: the router's own part of TTFT ends
        self.tokens = 0  # every choice's
        self.first_token_s: float | None = None
        self.ttft_phases: dict[str, float] | None = None  # the first token's, once it came
        self.last: dict[int, float] = {}
        self.gaps: list[float] = []
        self.finished = False

    def tick(self, choice: int, chunks: list[dict]) -> None:
        """A batch of a choice's chunks arrived: its tokens share the time since that choice's previous ones."""
        tokens = len(chunks[0]["token_ids"]) if len(chunks) == 1 else sum(len(chunk["token_ids"]) for chunk in chunks)
        if not tokens:
            return
        self.tokens += tokens
        now = time.perf_counter()
        last = self.last.get(choice)
        if last is not None:
            gap = (now - last) / tokens
            if tokens == 1:  # nearly always: one token per decode step
                self.gaps.append(gap)
            else:
                self.gaps += [gap] * tokens
        elif not self.last:
            self.first_token_s = now - self.arrived
            self.metrics.ttft.observe(self.first_token_s)
            self.ttft_phases = ttft_phases(self.first_token_s, self.dispatched - self.arrived, chunks[0])
            self.metrics.observe_ttft_phases(self.ttft_phases)
        self.last[choice] = now

    def done(self) -> None:
        self.finished = True
        self.metrics.e2e.observe(time.perf_counter() - self.arrived)

    def flush(self) -> None:
        self.metrics.itl.observe_many(self.gaps)
        self.gaps = []

    def summary(self) -> dict[str, object]:
        """For the request's log line: its tokens, time to the first and its phases, and time until now (its end)."""
        ttft = None if self.first_token_s is None else round(self.first_token_s, 4)
        phases = None if self.ttft_phases is None else {name: round(s, 6) for name, s in self.ttft_phases.items()}
        return {"completion_tokens": self.tokens, "ttft_s": ttft, "ttft_phases_s": phases,
                "e2e_s": round(time.perf_counter() - self.arrived, 4)}
