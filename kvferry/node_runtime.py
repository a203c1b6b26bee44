"""What prefill and decode nodes share: engine + transfer start-up, common routes, and turning an engine
stream into NDJSON lines (their settings are kvferry/node_config.py)."""

from __future__ import annotations

import gc
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from kvferry.engine import AsyncLLMEngine, EngineArgs, LLMEngine, RequestOutput
from kvferry.internal_api import StreamChunk
from kvferry.kvcache.prefix_index import prefix_index_from
from kvferry.node_config import NodeConfig, transfer_environment
from kvferry.node_metrics import NodeMetrics
from kvferry.node_reporter import NodeReporter, load_fields
from kvferry.router.auth import PROBE_PATHS, APIKeyMiddleware
from kvferry.transfer import TransferConfig, TransferEngine
from kvferry.transfer.kv_connector import pool_description

log = logging.getLogger(__name__)
# Monitoring stays open: Prometheus scrapes /metrics, and /stats is its JSON twin (counters, no control).
OPEN_PATHS = PROBE_PATHS | {"/metrics", "/stats"}


def engine_args_from(config: NodeConfig) -> EngineArgs:
    return EngineArgs(
        dtype=config.dtype, device=config.device, max_model_len=config.max_model_len, num_kv_blocks=config.num_kv_blocks,
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens, block_size=config.block_size,
        gpu_memory_fraction=config.gpu_memory_fraction, kv_cache_bytes=config.kv_cache_bytes,
        served_model_name=config.served_model_name,
    )


@dataclass
class NodeRuntime:
    config: NodeConfig
    engine: AsyncLLMEngine
    transfer: TransferEngine
    reporter: NodeReporter
    metrics: NodeMetrics

    @classmethod
    def start(cls, config: NodeConfig) -> NodeRuntime:
        # Before UCX reads its settings; an explicit UCX_* variable wins.
        for name, value in transfer_environment(config).items():
            os.environ.setdefault(name, value)
        # A host KV pool lives in memory the transfer engine allocates (shared memory on one host): a peer on
        # the same host writes KV blocks into it with plain copies instead of a system call per 512 KiB.
        # Making the transfer engine starts no UCX; a GPU pool ignores the allocator, and the engine makes the
        # node's GPU (--device cuda:N) current before UCX starts at initialize, in that GPU's context.
        transfer = TransferEngine(TransferConfig(timeout_seconds=config.transfer_timeout_seconds))
        engine = LLMEngine(config.model, engine_args_from(config), pool_allocator=transfer.allocate_managed_buffer)
        model = engine.served_model_name
        # The node registry record (docs/internals.md): who the node is; the reporter adds its load.
        transfer.initialize(
            config.name, config.registry, config.transfer_protocol, role=config.role, url=config.url,
            model=model, max_model_len=engine.max_model_len, epoch=time.time_ns(),
            pool=pool_description(model, engine.pool), **load_fields(engine), healthy=True,
        )
        metrics = NodeMetrics(config.role, config.name)
        async_engine = AsyncLLMEngine(engine, on_abort=metrics.aborts.inc)
        # The prefix index lives in the registry's Redis; a registry folder (no Redis) has no index.
        redis_url = config.registry if config.registry.startswith(("redis://", "rediss://", "unix://")) else None
        reporter = NodeReporter(
            config.name, async_engine.run_locked, lambda fields: transfer.update_record(**fields),
            lambda: async_engine.error is None, prefix_index_from(redis_url, model) if redis_url else None,
        )
        reporter.start()
        # What is alive now (torch, the model, the engine) lives as long as the process: out of the collector's
        # sight, as in the router. A full collection traversed all of it while requests streamed (a 113 ms pause
        # in the middle of one KV transfer on the GPU benchmark).
        gc.freeze()
        return cls(config, async_engine, transfer, reporter, metrics)

    @property
    def model_name(self) -> str:
        return self.engine.engine.served_model_name

    def stats(self) -> dict[str, object]:
        def read(engine: LLMEngine) -> dict[str, object]:
            blocks = engine.allocator.stats()
            return {
                "role": self.config.role,
                "name": self.config.name,
                "running": len(engine.scheduler.running),
                "waiting": len(engine.scheduler.waiting),
                "reserved": len(engine.reserved),
                "held_kv": len(engine.held_kv),
                "blocks": blocks.__dict__,
                "preemptions": engine.scheduler.num_preemptions,
                "transfer": dict(self.transfer.stats),
                "reporter": dict(self.reporter.stats),
            }

        return self.engine.run_locked(read)

    def render_metrics(self) -> bytes:
        def read(engine: LLMEngine) -> tuple[int, int, int, int]:
            blocks = engine.allocator.stats()
            return len(engine.scheduler.running), len(engine.scheduler.waiting), blocks.in_use, blocks.total

        return self.metrics.render(*self.engine.run_locked(read))

    def close(self) -> None:
        self.reporter.stop()
        self.engine.shutdown()
        self.transfer.close()


def add_common_routes(
    app: FastAPI, runtime: NodeRuntime, role_stats: Callable[[], dict[str, object]] = dict
) -> None:
    """/health, /ready, /stats (the runtime's, plus what `role_stats` adds) and /metrics; every other route
    requires the cluster token when the node has one."""
    token = runtime.config.cluster_token
    app.add_middleware(APIKeyMiddleware, keys=[token] if token else [], open_paths=OPEN_PATHS, credential="cluster token")
    if token is None:
        log.warning("%s: no cluster token configured: the internal API accepts calls from anyone who can reach "
                    "it (--cluster-token-file or KVFERRY_CLUSTER_TOKEN)", runtime.config.name)

    # On the event loop, not in the thread pool that blocking routes share: a node whose pool is full
    # of queued calls must still answer its probes at once.
    @app.get("/health")
    async def health() -> JSONResponse:
        if runtime.engine.error is not None:
            return JSONResponse({"status": "unhealthy", "error": repr(runtime.engine.error)}, status_code=503)
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


async def ndjson_deltas(stream: AsyncIterator[RequestOutput]) -> AsyncIterator[bytes]:
    """Cumulative engine outputs -> one JSON line per step with only what is new (n == 1)."""
    sent_tokens, sent_text = 0, 0
    try:
        async for output in stream:
            completion = output.outputs[0]
            chunk = StreamChunk(
                token_ids=completion.token_ids[sent_tokens:],
                text=completion.text[sent_text:],
                finish_reason=completion.finish_reason,
                logprobs=completion.logprobs[sent_tokens:] if completion.logprobs is not None else None,
            )
            sent_tokens, sent_text = len(completion.token_ids), len(completion.text)
            yield (chunk.model_dump_json() + "\n").encode()
    except Exception as exc:  # noqa: BLE001 - the stream is already open: report in-band, then end
        yield (json.dumps({"token_ids": [], "text": "", "finish_reason": "error", "error": str(exc)}) + "\n").encode()
    finally:
        # A reader that left closes this generator only: close the engine stream now (it aborts the
        # request), not whenever the garbage collector finalises it.
        await stream.aclose()  # type: ignore[attr-defined]
