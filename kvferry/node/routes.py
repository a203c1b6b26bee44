"""The routes both node roles serve: probes, /stats, /metrics, and the cluster token on everything else."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from kvferry import tracing
from kvferry.internal_api import API_PREFIX
from kvferry.node.runtime import NodeRuntime
from kvferry.router.admission.auth import PROBE_PATHS, APIKeyMiddleware
from kvferry.router.api.request_id import RequestIdMiddleware

log = logging.getLogger(__name__)
# A line per request at INFO (--log-level info), with the router's X-Request-Id (kvferry/logs.py).
request_log = logging.getLogger("kvferry.node.requests")
# Monitoring stays open: Prometheus scrapes /metrics, and /stats is its JSON twin (counters, no control).
OPEN_PATHS = PROBE_PATHS | {"/metrics", "/stats"}
# Traces (kvferry/tracing.py): a node's span of an internal call continues the router's trace it carries.
NODE_TELEMETRY = tracing.fastapi_telemetry(API_PREFIX, continued_only=True)


def add_common_routes(
    app: FastAPI, runtime: NodeRuntime, role_stats: Callable[[], dict[str, object]] = dict
) -> None:
    """/health, /ready, /stats (the runtime's, plus what `role_stats` adds) and /metrics; every other route
    requires the cluster token when the node has one. A call's `X-Request-Id` is bound while it is served."""
    token = runtime.config.cluster_token
    app.add_middleware(APIKeyMiddleware, keys=[token] if token else [], open_paths=OPEN_PATHS, credential="cluster token")
    app.add_middleware(RequestIdMiddleware, make_missing=False)  # the router's id for the request, on the node's lines
    if token is None:
        log.warning("%s: no cluster token configured: the internal API accepts calls from anyone who can reach "
                    "it (--cluster-token-file or KVFERRY_CLUSTER_TOKEN)", runtime.config.name)

    # On the event loop, not in the thread pool that blocking routes share: a node whose pool is full
    # of queued calls must still answer its probes at once.
    @app.get("/health")
    async def health() -> JSONResponse:
        error = runtime.engine_error()
        if error is not None:
            return JSONResponse({"status": "unhealthy", "error": repr(error)}, status_code=503)
        return JSONResponse({"status": "ok", "role": runtime.config.role, "model": runtime.model_name})

    @app.get("/ready")
    async def ready() -> JSONResponse:
        return await health()

    @app.get("/stats")
    def stats() -> dict[str, object]:
        return {**runtime.stats(), **role_stats()}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(runtime.render_metrics(), media_type="text/plain; version=0.0.4")
