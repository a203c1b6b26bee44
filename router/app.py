"""The router's FastAPI app: OpenAI routes, probes, metrics, and the wiring of its parts."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response

from kvferry import tracing
from kvferry.engine.tokenizer import tokenizer_fingerprint
from kvferry.internal_api import CALLER_KEEPALIVE_SECONDS
from kvferry.kvcache.node_registry import registry_from
from kvferry.kvcache.prefix_index import PrefixIndex, prefix_index_from
from kvferry.request_id import request_id_headers
from kvferry.router.admission.auth import PROBE_PATHS, APIKeyMiddleware, bearer_headers, cluster_token_from
from kvferry.router.admission.limit import Admission
from kvferry.router.admission.plugins import load_plugins
from kvferry.router.api.body_limit import BodyLimitMiddleware
from kvferry.router.api.draining import DrainingMiddleware
from kvferry.router.api.errors import ERROR_RESPONSES, install_error_handlers
from kvferry.router.api.openai_schema import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from kvferry.router.api.prompts import ModelLimits, PromptEncoder
from kvferry.router.api.request_body import RequestCheck
from kvferry.router.api.request_id import RequestIdMiddleware
from kvferry.router.api.tokenize import Tokenization
from kvferry.router.config import RouterConfig
from kvferry.router.discovery.cluster import ClusterState
from kvferry.router.discovery.health import HealthTracker
from kvferry.router.discovery.registry_view import RegistryView
from kvferry.router.discovery.sources import Discovery, RegistryDiscovery, StaticDiscovery
from kvferry.router.dispatch.migration import Migration
from kvferry.router.dispatch.node_streams import NodeStreams
from kvferry.router.dispatch.pd_flow import PDFlow
from kvferry.router.metrics import RouterMetrics
from kvferry.router.responses.schema import DeletedResponse, ResponseObject, ResponsesRequest
from kvferry.router.responses.service import ResponsesService
from kvferry.router.responses.store import response_store_from
from kvferry.router.scheduling import Scheduler
from kvferry.router.scheduling.pd_decision import PDDecision
from kvferry.router.scheduling.prefix_lookup import PrefixLookup
from kvferry.router.scheduling.routing_history import RoutingHistory
from kvferry.router.scheduling.sessions import SessionAffinity
from kvferry.router.service import CompletionService

TRUST_CHECK_SECONDS = 10.0  # how often the nodes' CA bundle is looked at for a rotated CA

NODE_CLIENT_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=512,
                                  keepalive_expiry=CALLER_KEEPALIVE_SECONDS)


def _discovery(config: RouterConfig, view: RegistryView) -> Discovery:
    settings = config.discovery
    if settings.mode == "registry":
        return RegistryDiscovery(view, config.node_scheme)
    if settings.mode == "kubernetes":
        from kvferry.router.discovery.kubernetes import KubernetesDiscovery

        return KubernetesDiscovery.from_config(settings, config.node_scheme)
    return StaticDiscovery(settings.prefill, settings.decode)


def _generation_responses(model: type) -> dict[int | str, dict[str, Any]]:
    # One SSE event: `data:` holds a chunk as JSON (an error object after a failure), the last one `[DONE]`.
    event = {"type": "object", "properties": {"data": {"type": "string"}, "event": {"type": "string"}}, "required": ["data"]}
    streamed = {"text/event-stream": {"schema": event}}
    return {200: {"model": model, "content": streamed, "description": "The completion, or its SSE stream"}, **ERROR_RESPONSES}


def _openapi_without_422(app: FastAPI) -> dict[str, Any]:
    # Invalid bodies get 400 (OpenAI's status), so FastAPI's automatic 422 would document a lie.
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema


async def _bear_request_id(request: httpx.Request) -> None:
    """Every node call made for a request carries its id (kvferry/request_id.py)."""
    request.headers.update(request_id_headers())


def _checking_server_name(name: str) -> Callable[[httpx.Request], Awaitable[None]]:
    async def check(request: httpx.Request) -> None:
        request.extensions["sni_hostname"] = name  # the name the node's certificate must carry (tls/client.py)

    return check


def create_app(config: RouterConfig, index: PrefixIndex | None = None, discovery: Discovery | None = None) -> FastAPI:
    """`index` and `discovery` replace the ones the config names (tests)."""
    model = config.served_model_name
    metrics = RouterMetrics()
    # Every call to a node bears the cluster token (the nodes' internal API refuses calls without it).
    node_headers = bearer_headers(cluster_token_from(config.cluster_token_file))
    trust = config.internal_tls.node_trust() if config.internal_tls is not None else None
    tls: ssl.SSLContext | None = trust.context() if trust is not None else None
    server_name = trust.server_name if trust is not None else None
    hooks = [_bear_request_id] + ([_checking_server_name(server_name)] if server_name else [])
    client = httpx.AsyncClient(limits=NODE_CLIENT_LIMITS, timeout=httpx.Timeout(60.0, connect=5.0), headers=node_headers,
                               verify=tls if tls is not None else True, event_hooks={"request": hooks})
    view = RegistryView(registry_from(config.registry_url) if config.registry_url else None, config.stale_record_seconds)
    cluster = ClusterState(discovery or _discovery(config, view), view, HealthTracker(), config.health_interval_seconds, client,
                           config.probe_timeout_seconds, tokenizer_fingerprint(config.model.path))
    if index is None and config.redis.url:
        index = prefix_index_from(config.redis.url, model)
    encoder = PromptEncoder(config.model.path, ModelLimits.from_dir(config.model.path, config.model.max_model_len),
                            config.model.chat_template_source())
    pd = PDDecision(config.disaggregation, config.disaggregation_min_tokens)
    admission = Admission(config.max_inflight)
    flow = PDFlow(client, NodeStreams(node_headers, tls, server_name), cluster, metrics, config.prefill_timeout_seconds, pd)
    check = RequestCheck(model, config.unsupported_fields)
    service = CompletionService(
        model=model, encoder=encoder, cluster=cluster,
        lookup=PrefixLookup(model, index, RoutingHistory(config.routing_history_seconds)),
        scheduler=Scheduler(config.resolve_policy(), pd=pd),
        migration=Migration(flow, metrics, config.max_migrations),
        metrics=metrics, plugins=load_plugins(config.plugins), admission=admission,
        default_max_tokens=config.default_max_tokens, check=check,
        sessions=SessionAffinity(config.session_ttl_seconds),
        output_form=encoder.output_form(None if config.tool_call_parser == "auto" else config.tool_call_parser,
                                        None if config.reasoning_parser == "auto" else config.reasoning_parser == "think"),
    )
    tokenization = Tokenization(encoder, check)
    response_store = response_store_from(config.redis.url, model, config.response_ttl_seconds)
    responses = ResponsesService(service, response_store, check, lambda text: len(encoder.tokens(text, False)))
    started = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await cluster.start()
        trust_check = (asyncio.create_task(trust.watch(tls).check_every(TRUST_CHECK_SECONDS))
                       if trust is not None and tls is not None else None)
        # What is alive now (the imports: ~75k objects, ~250k when they still brought torch) lives as long as
        # the process: out of the collector's sight. Each full collection traversed all of it (~0.1 s with
        # torch) while requests stream, and those collections were about a third of the router's CPU at 64
        # streams (docs/router.md).
        gc.freeze()
        yield
        if trust_check is not None:
            trust_check.cancel()
        await cluster.stop()
        await flow.aclose()
        await response_store.aclose()
        await client.aclose()

    # Traces (kvferry/tracing.py): FastAPI's span of an API request is its trace's root.
    app = FastAPI(title="kvferry router", version="1", lifespan=lifespan,
                  telemetry=tracing.fastapi_telemetry("/v1/", continued_only=False))
    app.openapi = lambda: _openapi_without_422(app)  # type: ignore[method-assign]
    install_error_handlers(app, on_invalid_body=lambda: metrics.request_done(400))
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    open_paths = PROBE_PATHS if config.metrics_need_auth else PROBE_PATHS | {"/metrics"}
    app.add_middleware(APIKeyMiddleware, keys=config.api_keys, open_paths=open_paths)
    app.add_middleware(RequestIdMiddleware, make_missing=True)  # refusals too carry the id
    app.add_middleware(DrainingMiddleware)  # outermost: the kubelet's preStop call bears no key
    app.state.cluster, app.state.metrics, app.state.service = cluster, metrics, service
    metrics.inflight.set_function(lambda: service.admission.inflight)
    unauthorized = {401: ERROR_RESPONSES[401]}

    @app.post("/v1/completions", response_model=None, responses=_generation_responses(CompletionResponse))
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await service.serve(body, request)

    @app.post("/v1/chat/completions", response_model=None, responses=_generation_responses(ChatCompletionResponse))
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await service.serve(body, request)

    @app.post("/v1/responses", response_model=None, responses=_generation_responses(ResponseObject))
    async def create_response(body: ResponsesRequest, request: Request) -> Response:
        return await responses.create(body, request)

    @app.get("/v1/responses/{response_id}", response_model=None,
             responses={200: {"model": ResponseObject}, 404: ERROR_RESPONSES[404], **unauthorized})
    async def retrieve_response(response_id: str) -> Response:
        return await responses.retrieve(response_id)

    @app.delete("/v1/responses/{response_id}", response_model=None,
                responses={200: {"model": DeletedResponse}, 404: ERROR_RESPONSES[404], **unauthorized})
    async def delete_response(response_id: str) -> Response:
        return await responses.delete(response_id)

    token_errors: dict[int | str, dict[str, Any]] = {status: ERROR_RESPONSES[status] for status in (400, 401, 404, 413)}

    @app.post("/tokenize", responses=token_errors)
    def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        """A prompt's (or chat messages') tokens, as the router encodes them for generation."""
        return tokenization.tokenize(body)

    @app.post("/detokenize", responses=token_errors)
    def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        return tokenization.detokenize(body)

    @app.get("/v1/models", responses=unauthorized)
    def models() -> ModelList:
        return ModelList(data=[ModelCard(id=model, created=started, max_model_len=encoder.max_model_len)])

    @app.get("/health")
    def health() -> dict[str, str]:
        """Liveness: the router process answers."""
        return {"status": "ok"}

    @app.get("/ready", responses={503: {"description": "No healthy decode node yet"}})
    def ready() -> JSONResponse:
        """Readiness: at least one healthy decode node to send requests to."""
        decode = [node for node in cluster.views() if node.role == "decode" and node.healthy]
        return JSONResponse({"status": "ready" if decode else "waiting for a decode node"}, status_code=200 if decode else 503)

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}, **unauthorized})
    def prometheus() -> Response:
        return Response(metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/stats", responses=unauthorized)
    def stats() -> dict[str, Any]:
        """Counters as JSON, and the nodes as the scheduler sees them."""
        nodes = [node.__dict__ for node in cluster.views()]
        return {**metrics.stats(), "policy": config.resolve_policy().name, "inflight": admission.inflight,
                "disaggregation": pd.stats(), "nodes": nodes}

    return app
