"""A real redis-server on a free loopback port, for tests (pytest plugin: fixture `redis_url`)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from kvferry.cli.ports import free_port
from kvferry.cli.redis_server import RedisServer

__all__ = ["free_port", "redis_url"]


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("redis-server") is None and not os.environ.get("CI"):
        pytest.skip("redis-server is not installed; run `make test` to install it")
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server.url
    server.stop()
