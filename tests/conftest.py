"""Shared pytest fixtures, one clearly separated section per subsystem."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redisproc import RedisProc

from celery_interval.stores.redis import RedisStore

# ---------------------------------------------------------------------------------------
# Redis: a private redis-server for the whole session (never the developer's own Redis).
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisProc]:
    """A private redis-server (no persistence) on an ephemeral port, for the session."""
    server = RedisProc()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_client(redis_server: RedisProc) -> Iterator[redis.Redis[Any]]:
    """A client of the private server whose database is flushed before the test."""
    if not redis_server.alive:  # a test killed it: bring it back, empty
        redis_server.restart()
    client: redis.Redis[Any] = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def redis_store(redis_client: redis.Redis[Any]) -> Iterator[RedisStore]:
    """A RedisStore (default key prefix, Redis TIME clock) on the flushed private server."""
    store = RedisStore(redis_client)
    try:
        yield store
    finally:
        store.close()


# ---------------------------------------------------------------------------------------
