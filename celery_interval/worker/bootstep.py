"""The consumer bootstep: a thin adapter that gives each consumer one IntervalService."""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.worker.state import reserved_requests

from celery_interval.config import settings_of
from celery_interval.stores import store_for_settings
from celery_interval.worker import started
from celery_interval.worker.service import IntervalService
from celery_interval.worker.timeouts import warn_broker_timeouts

__all__ = ["IntervalStep", "service_for"]

logger = logging.getLogger("celery_interval.worker")


def service_for(c: Any) -> IntervalService:
    """The consumer's service, created on first use (the strategy may ask before start)."""
    service: IntervalService | None = getattr(c, "interval_service", None)
    if service is None:
        settings = settings_of(c.app)
        service = IntervalService(
            settings=settings,
            store=store_for_settings(settings),
            timer=c.timer,
            hostname=c.hostname,
            pool_slots=lambda: max(1, int(c.pool.limit or 1)) - len(reserved_requests),
            stop_queue=lambda queue: _stop_queue(c, queue),
            resume_queue=lambda queue: _resume_queue(c, queue),
            qos=lambda: c.qos,
        )
        c.interval_service = service
    return service


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


def _survive_channel_errors(app: Any) -> None:
    """Held messages stay unacked: a broker that closes the channel of a long hold (RabbitMQ's
    ``consumer_timeout``) must make the consumer reconnect (the messages return to the queue and
    are granted again; the dedupe drops copies), not stop the worker."""
    if not app.conf.broker_channel_error_retry:
        app.conf.broker_channel_error_retry = True
        logger.info("interval: broker_channel_error_retry enabled (held messages stay unacked)")


class IntervalStep(bootsteps.StartStopStep):
    """Starts the interval service with the consumer; drops held copies when the channel goes."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        c.interval_service = None
        _survive_channel_errors(c.app)
        super().__init__(c, **kwargs)

    def start(self, c: Any) -> None:
        service = service_for(c)
        warn_broker_timeouts(c.app, service.settings)
        started.warm(c.app)  # for tasks run in this process (threads, solo pools)
        try:
            service.store.ping()
        except Exception as exc:
            service.on_outage(exc)  # the outage's one log line; tasks are held until it ends

    def stop(self, c: Any) -> None:
        if c.interval_service is not None:
            c.interval_service.connection_lost()

    def shutdown(self, c: Any) -> None:
        if c.interval_service is not None:
            c.interval_service.connection_lost()
            c.interval_service.close()
            c.interval_service = None
