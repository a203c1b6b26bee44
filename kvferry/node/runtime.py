"""A node's start-up and what it owns for its life: the engine, the transfer engine, the KV pool they
share, the load reporter and the metrics (settings: config.py; routes both roles serve: routes.py)."""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass

from kvferry.engine import AsyncLLMEngine, EngineArgs, LLMEngine
from kvferry.engine.tokenizer import tokenizer_fingerprint
from kvferry.kvcache.kv_pool import KVPool
from kvferry.kvcache.prefix_index import prefix_index_from
from kvferry.node.config import NodeConfig, transfer_environment
from kvferry.node.metrics import NodeMetrics
from kvferry.node.reporter import NodeReporter, load_fields
from kvferry.transfer import TransferConfig, TransferEngine
from kvferry.transfer.kv_connector import pool_description


def engine_args_from(config: NodeConfig) -> EngineArgs:
    return EngineArgs(
        dtype=config.dtype, quantization=config.quantization, device=config.device, max_model_len=config.max_model_len, num_kv_blocks=config.num_kv_blocks,
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
    pool: KVPool  # the engine's KV pool, registered with the transfer engine: what the connector moves
    model_name: str

    @classmethod
    def start(cls, config: NodeConfig) -> NodeRuntime:
        # Before UCX reads its settings; an explicit UCX_* variable wins.
        for name, value in transfer_environment(config).items():
            os.environ.setdefault(name, value)
        # A host KV pool lives in memory the transfer engine allocates (shared memory on one host): a peer on
        # the same host writes KV blocks into it with plain copies instead of a system call per 512 KiB.
        # Making the transfer engine starts no UCX; a GPU pool ignores the allocator, and the engine makes the
        # node's GPU (--device cuda:N) current before UCX starts at initialize, in that GPU's context.
        transfer = TransferEngine(TransferConfig(timeout_seconds=config.transfer_timeout_seconds,
                                                 cluster_token=config.cluster_token))
        engine = LLMEngine(config.model, engine_args_from(config), pool_allocator=transfer.allocate_managed_buffer)
        model = engine.served_model_name
        # The node registry record (docs/internals.md): who the node is; the reporter adds its load.
        transfer.initialize(
            config.name, config.registry, config.transfer_protocol, role=config.role, url=config.url,
            model=model, tokenizer=tokenizer_fingerprint(engine.model_dir), max_model_len=engine.max_model_len,
            epoch=time.time_ns(),
            pool=pool_description(model, engine.pool), **load_fields(engine), healthy=True,
        )
        metrics = NodeMetrics(config.role, config.name)
        async_engine = AsyncLLMEngine(engine, on_abort=metrics.aborts.inc, on_step=metrics.busy_seconds.inc)
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
        return cls(config, async_engine, transfer, reporter, metrics, engine.pool, model)

    def engine_error(self) -> BaseException | None:
        """What stopped the engine's loop, or None while it runs."""
        return self.engine.error

    def stats(self) -> dict[str, object]:
        now = self.engine.run_locked(LLMEngine.occupancy)
        return {
            "role": self.config.role,
            "name": self.config.name,
            "running": now.running,
            "waiting": now.waiting,
            "reserved": now.reserved,
            "held_kv": now.held_kv,
            "blocks": now.blocks.__dict__,
            "preemptions": now.preemptions,
            "transfer": dict(self.transfer.stats),
            "reporter": dict(self.reporter.stats),
        }

    def render_metrics(self) -> bytes:
        now = self.engine.run_locked(LLMEngine.occupancy)
        return self.metrics.render(now.running, now.waiting, now.blocks.in_use, now.blocks.total)

    def close(self) -> None:
        self.reporter.stop()
        self.engine.shutdown()
        self.transfer.close()
