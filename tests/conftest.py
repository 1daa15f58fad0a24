"""Shared pytest fixtures, one clearly separated section per subsystem."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_interval.demo.embedded import RedisProc
from celery_interval.stores.redis import RedisStore

#: The test directories whose tests start worker processes, brokers or Spark.
SLOW_DIRS = frozenset({"integration", "faults", "spark"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of ``SLOW_DIRS`` is ``slow``: ``-m "not slow"`` runs ``tests/unit`` alone."""
    for item in items:
        if SLOW_DIRS & set(item.path.parts):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _cpu_s(request: pytest.FixtureRequest) -> Iterator[None]:
    """With ``CI_TEST_CPU_LOG=FILE``, a line per test there: its id and CPU seconds, its
    process's and that of the children it reaped meanwhile (worker processes, servers): which
    tests compute and which wait (a module's pool counts where it ends)."""
    log = os.environ.get("CI_TEST_CPU_LOG")
    before = os.times()
    yield
    if log:
        after = os.times()
        with open(log, "a") as out:
            out.write(f"{sum(after[:4]) - sum(before[:4]):.2f} {request.node.nodeid}\n")


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
    """A client of the private server whose database is flushed before and after the test."""
    if not redis_server.alive:  # a test killed it: bring it back, empty
        redis_server.restart()
    client: redis.Redis[Any] = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    try:
        yield client
    finally:
        # Nothing stays for later tests of the session: on an injected clock ahead of real
        # time a test leaves the store's birth marker (ci:{~born}) in the future, and real
        # workers' new buckets on this database would wait for it (0 starts).
        if redis_server.alive:
            client.flushdb()
        client.close()


@pytest.fixture(scope="module")
def cluster_client() -> Iterator[redis.RedisCluster[Any]]:
    """A RedisCluster client of a private one-node cluster (redis-py's cluster code paths)."""
    with RedisProc(cluster=True) as server:
        client: redis.RedisCluster[Any] = redis.RedisCluster(host="127.0.0.1", port=server.port)
        yield client
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
# Real worker pools: brokers (RabbitMQ of the machine, or the private Redis) and `celery worker`s.
# ---------------------------------------------------------------------------------------


@pytest.fixture
def make_pool(redis_server: RedisProc, tmp_path: Any) -> Iterator[Any]:
    """A factory of Pools of real workers; every pool is stopped after the test."""
    from tests.helpers.brokers import rabbitmq_url
    from tests.helpers.pool import Pool

    pools: list[Pool] = []
    if not redis_server.alive:
        redis_server.restart()

    def make(interval_s: float, broker: str = "rabbitmq", **kwargs: Any) -> Pool:
        if "://" in broker:  # a broker of the test's own (a private RabbitMQ node)
            url = broker
        else:
            url = rabbitmq_url() if broker == "rabbitmq" else redis_server.broker_url_for(1)
        kwargs.setdefault("store", redis_server.url_for(0))
        pool = Pool(broker=url, interval_s=interval_s, tmp=tmp_path, **kwargs)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.stop()


@pytest.fixture
def faketime_env() -> dict[str, str]:
    """Environment that puts a worker's clocks 7 s ahead (libfaketime; it shifts the monotonic
    clock too, as excluding it breaks ``time.sleep`` under libfaketime)."""
    import glob
    import os

    libs = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    if not libs:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and libfaketime is missing (apt-get install faketime)")
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    return {"LD_PRELOAD": libs[0], "FAKETIME": "+7s"}
