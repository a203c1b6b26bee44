"""Fixtures of the transfer tests (tests/integration/test_transfer*.py): engines in the test
process, and transfer peers in their own processes, all closed after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from support.block_sets import NUM_BLOCKS
from support.peer_process import PeerProcess
from support.transfer_peer import make_pool

from kvferry.kvcache.kv_pool import KVPool
from kvferry.transfer import TransferConfig, TransferEngine
from kvferry.transfer.kv_connector import pool_description


@pytest.fixture
def local_engine(redis_url: str, request: pytest.FixtureRequest) -> Iterator[Callable[..., tuple[TransferEngine, KVPool]]]:
    """start(name, dtype="float32", **TransferConfig fields) -> (an initialized engine, a pool of its own)."""
    engines: list[TransferEngine] = []

    def start(name: str, dtype: str = "float32", **config: object) -> tuple[TransferEngine, KVPool]:
        pool = make_pool(dtype, NUM_BLOCKS)
        engine = TransferEngine(TransferConfig(**config))  # type: ignore[arg-type]
        engine.initialize(f"{name}-{request.node.name}", redis_url, "ucx", pool=pool_description("tiny", pool))
        engines.append(engine)
        return engine, pool

    yield start
    for engine in engines:
        engine.close()


@pytest.fixture
def peers() -> Iterator[Callable[..., PeerProcess]]:
    """start(name, registry, module=..., **peer flags) -> a running transfer peer process."""
    started: list[PeerProcess] = []

    def start(name: str, registry: str, **options: object) -> PeerProcess:
        peer = PeerProcess(name, registry, **options)  # type: ignore[arg-type]
        started.append(peer)
        return peer

    yield start
    for peer in started:
        peer.close()
