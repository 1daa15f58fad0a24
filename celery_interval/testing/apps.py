"""Point an app at a private Redis for a test, and run it in a worker thread of the test."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from celery_interval import config
from celery_interval.app_store import forget_store
from celery_interval.buckets import queue_of

__all__ = ["configure_app", "start_interval_worker", "worker_queues"]


def configure_app(
    app: Any,
    redis_url: str,
    *,
    intervals: Mapping[str, float | str] | None = None,
    result_backend: bool = True,
) -> Any:
    """Make ``redis_url`` the broker, the interval store and (``result_backend``) the result
    backend of ``app``; ``intervals`` replaces some entries of ``interval_queues`` (a 1 s queue
    at 0.05 s for a quick test). Call it before the app sends or connects; returns ``app``."""
    conf = app.conf
    conf.broker_url = redis_url
    conf.interval_store_url = redis_url
    if result_backend:
        conf.result_backend = redis_url
    if intervals:
        conf.interval_queues = {**(conf.interval_queues or {}), **intervals}
    conf.broker_connection_retry_on_startup = True
    # An in-thread worker must leave pytest's logging and output capture alone.
    conf.worker_hijack_root_logger = False
    conf.worker_redirect_stdouts = False
    config.forget(app)
    forget_store(app)
    config.settings_of(app)  # a bad interval_* setting fails here, naming the key
    return app


def worker_queues(app: Any, extra: Sequence[str] = ()) -> list[str]:
    """The queues a test worker consumes: every interval queue, the default queue, ``extra``."""
    settings = config.settings_of(app)
    names = {queue_of(bucket) for bucket in settings.buckets()}
    names.add(app.conf.task_default_queue)
    names.update(extra)
    return sorted(names)


@contextlib.contextmanager
def start_interval_worker(
    app: Any,
    *,
    pool: str = "threads",
    concurrency: int = 2,
    queues: Sequence[str] | None = None,
    **kwargs: Any,
) -> Iterator[Any]:
    """Celery's ``celery.contrib.testing.worker.start_worker`` with what an interval app needs:
    it consumes every interval queue (``queues`` to choose), with no ping task, in a thread of
    this process (pools ``threads`` or ``solo``; the bootstep runs as in ``celery worker``)."""
    from celery.contrib.testing.worker import start_worker

    consumed = list(queues) if queues is not None else worker_queues(app)
    with start_worker(
        app,
        pool=pool,
        concurrency=concurrency,
        queues=consumed,
        perform_ping_check=False,
        **kwargs,
    ) as worker:
        yield worker
