"""A pytest plugin for testing interval tasks: ``pytest_plugins = ["celery_interval.testing"]``.

Fixtures: ``interval_redis`` (a private redis-server for the session), ``interval_redis_url``
(its URL, emptied before each test), ``interval_app`` (override it: your app, pointed at that
URL with ``configure_app``), ``interval_worker`` (an in-thread worker of it),
``interval_worker_processes`` (real ``celery worker`` processes) and ``interval_control``
(pause, unpause, set an interval, read and check the starts).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_interval.demo.embedded import RedisProc
from celery_interval.testing.apps import configure_app, start_interval_worker, worker_queues
from celery_interval.testing.controls import IntervalControl
from celery_interval.testing.processes import WorkerProcesses
from celery_interval.testing.starts import Start, assert_spaced, ledger_starts, wait_for_starts

__all__ = [
    "IntervalControl",
    "Start",
    "WorkerProcesses",
    "assert_spaced",
    "configure_app",
    "ledger_starts",
    "start_interval_worker",
    "wait_for_starts",
    "worker_queues",
]


@pytest.fixture(scope="session")
def interval_redis() -> Iterator[RedisProc]:
    """A private redis-server (no persistence, ephemeral port) for the whole session."""
    server = RedisProc()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def interval_redis_url(interval_redis: RedisProc) -> str:
    """The private server's URL (broker, store and result backend), emptied for this test."""
    import redis

    if not interval_redis.alive:  # a test killed it: bring it back, empty
        interval_redis.restart()
    client = redis.Redis.from_url(interval_redis.url)
    try:
        client.flushall()
    finally:
        client.close()
    return interval_redis.url


@pytest.fixture
def interval_app(interval_redis_url: str) -> Any:
    """The app under test: override this fixture to return yours, configured with
    ``configure_app(app, interval_redis_url)``."""
    pytest.fail(
        "override the interval_app fixture to return your Celery app, e.g.\n"
        "    @pytest.fixture\n"
        "    def interval_app(interval_redis_url):\n"
        "        return configure_app(my_app, interval_redis_url)"
    )


@pytest.fixture
def interval_worker(interval_app: Any) -> Iterator[Any]:
    """A worker of ``interval_app`` in a thread of this process (threads pool, two threads),
    consuming every interval queue and the default queue; stopped after the test."""
    with start_interval_worker(interval_app) as worker:
        yield worker


@pytest.fixture
def interval_worker_processes(
    interval_app: Any, interval_redis_url: str, tmp_path: Path
) -> Iterator[WorkerProcesses]:
    """A starter of real ``celery worker`` processes of ``interval_app``:
    ``.start("proj.celery:app", n)``; every worker is stopped after the test."""
    processes = WorkerProcesses(interval_app, interval_redis_url, tmp_path)
    try:
        yield processes
    finally:
        processes.stop()


@pytest.fixture
def interval_control(interval_app: Any) -> IntervalControl:
    """Pause, unpause, set an interval and read a bucket's starts, for ``interval_app``."""
    return IntervalControl(interval_app)
