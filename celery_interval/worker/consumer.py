"""The consumer's IntervalService, made on first use and wired to its pool, queues and timer."""

from __future__ import annotations

import logging
from typing import Any

from celery.worker.state import reserved_requests

from celery_interval.config import settings_of
from celery_interval.stores import store_for_settings
from celery_interval.stores.overflow import overflow_index_for
from celery_interval.worker.notify import Notify
from celery_interval.worker.service import IntervalService

__all__ = ["free_processes", "service_for"]

logger = logging.getLogger("celery_interval.worker")


def service_for(c: Any) -> IntervalService:
    """The consumer's service, created on first use (the strategy may ask before start)."""
    service: IntervalService | None = getattr(c, "interval_service", None)
    if service is None:
        settings = settings_of(c.app)
        store = store_for_settings(settings)
        service = IntervalService(
            settings=settings,
            store=store,
            timer=c.timer,
            hostname=c.hostname,
            pool_slots=lambda: free_processes(c.pool),
            stop_queue=lambda queue: _stop_queue(c, queue),
            resume_queue=lambda queue: _resume_queue(c, queue),
            qos=lambda: c.qos,
            overflow_index=overflow_index_for(store, settings.key_prefix),
            call_soon=c.call_soon,
            notify=Notify(lambda: getattr(c, "event_dispatcher", None), c),
        )
        c.interval_service = service
    return service


def free_processes(pool: Any) -> int:
    """Pool processes that can start a task now: the pool's size less the tasks it was given.

    A prefork pool counts only processes that are up: one that replaces a process that left
    (``--max-tasks-per-child``, ``--max-memory-per-child``, a hard time limit) takes a while to
    start, and a task given to the pool meanwhile would start late.
    """
    limit = max(1, int(pool.limit or 1))
    processes = getattr(getattr(pool, "_pool", None), "_fileno_to_inq", None)
    if isinstance(processes, dict):
        limit = len(processes)
    return limit - len(reserved_requests)


def _stop_queue(c: Any, queue: str) -> None:
    if c.task_consumer is not None and c.task_consumer.consuming_from(queue):
        logger.info("interval: %s held tasks reached interval_max_held, pausing fetch", queue)
        c.task_consumer.cancel_by_queue(queue)


def _resume_queue(c: Any, queue: str) -> None:
    queues = c.app.amqp.queues
    if c.task_consumer is None or queue not in queues or c.task_consumer.consuming_from(queue):
        return
    c.task_consumer.add_queue(queues[queue])
    c.task_consumer.consume()
