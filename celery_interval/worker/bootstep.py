"""The consumer bootstep: a thin adapter that gives each consumer one IntervalService."""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from celery_interval.placement import is_paced
from celery_interval.stores import mask_url
from celery_interval.worker.broker.brokerloss import (
    BrokerWatch,
    install_pop_rescue,
    install_restore_fix,
)
from celery_interval.worker.broker.delivery import consumed_queue, stamp_consumed_queues
from celery_interval.worker.broker.overflow_queues import ConsumerBroker
from celery_interval.worker.broker.timeouts import warn_broker_timeouts
from celery_interval.worker.broker.visibility import VisibilityRefresh, short_sweep_lock
from celery_interval.worker.consumer import service_for
from celery_interval.worker.hubtimers import poll_until_next_timer
from celery_interval.worker.process import started
from celery_interval.worker.strategy import interval_strategy

__all__ = ["IntervalStep"]

logger = logging.getLogger("celery_interval.worker")


def _survive_channel_errors(app: Any) -> str:
    """Held messages stay unacked: a broker that closes the channel of a long hold (RabbitMQ's
    ``consumer_timeout``) must make the consumer reconnect (the messages return to the queue and
    are granted again; the dedupe drops copies), not stop the worker. A user who set
    ``broker_channel_error_retry=False`` keeps it, and is told what it costs."""
    if "broker_channel_error_retry" in app.conf.changes and not app.conf.broker_channel_error_retry:
        logger.warning(
            "interval: broker_channel_error_retry=False: a broker that closes the channel of "
            "held tasks (RabbitMQ consumer_timeout) stops this worker instead of reconnecting"
        )
        return "broker_channel_error_retry off (set by the app)"
    app.conf.broker_channel_error_retry = True
    return "broker_channel_error_retry on"


def _pace_other_tasks(c: Any, interval_queues: set[str]) -> list[str]:
    """Every task consumed from an interval queue is paced, whatever its base class: a plain
    task's message from an interval queue goes through the interval strategy too (Celery's own
    ``celery.*`` tasks excepted: a chord's unlock must not wait for a slot)."""
    paced: list[str] = []
    if not interval_queues:
        return paced
    for name, task in c.app.tasks.items():
        if is_paced(task) or name.startswith("celery.") or name not in c.strategies:
            continue
        c.strategies[name] = _by_queue(
            name, c.strategies[name], interval_strategy(task, c.app, c), interval_queues
        )
        paced.append(name)
    return paced


def _by_queue(name: str, default: Any, interval: Any, interval_queues: set[str]) -> Any:
    """A strategy handler: the interval one for messages from an interval queue."""
    told = False

    def handler(message: Any, *args: Any) -> Any:
        nonlocal told
        queue = consumed_queue(message)
        if queue not in interval_queues:
            return default(message, *args)
        if not told:
            told = True
            logger.warning(
                "interval: plain task %s consumed from interval queue %s: paced as an "
                "IntervalTask would be",
                name,
                queue,
            )
        return interval(message, *args)

    return handler


def _warn_rate_limits(app: Any) -> None:
    for name, task in sorted(app.tasks.items()):
        if is_paced(task) and task.rate_limit:
            logger.warning(
                "interval: task %s sets rate_limit=%r, which an IntervalTask does not apply; its "
                "starts follow its bucket's interval across the pool (set interval=%r instead)",
                name,
                task.rate_limit,
                task.rate_limit,
            )


class IntervalStep(bootsteps.StartStopStep):
    """Starts the interval service with the consumer; drops held copies when the channel goes."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        c.interval_service = None
        self.channel_errors = _survive_channel_errors(c.app)
        self.sweep_lock = short_sweep_lock(c.app)
        self.announced = False
        self.broker = BrokerWatch()
        self.visibility: VisibilityRefresh | None = None
        install_restore_fix()
        install_pop_rescue()
        super().__init__(c, **kwargs)

    def start(self, c: Any) -> None:
        self.broker.started(c)
        service = service_for(c)
        service.connected()
        _read_before_collect(c)
        poll_until_next_timer(getattr(c, "hub", None))
        settings = service.settings
        stamp_consumed_queues(c.task_consumer.channel)
        if self.visibility is None:
            self.visibility = VisibilityRefresh(c.timer)
        self.visibility.start(c.task_consumer.channel)
        paced = _pace_other_tasks(c, set(settings.queues_us))
        if service.parking is not None:
            service.parking.start(ConsumerBroker(c))
        if not self.announced:  # once per worker, not per reconnect
            self.announced = True
            queues = ", ".join(f"{q}={us / 1e6:g}s" for q, us in sorted(settings.queues_us.items()))
            logger.info(
                "interval: queues %s; store %s; %d plain task(s) paced on these queues; %s",
                queues or "none",
                mask_url(settings.store_url),
                len(paced),
                "; ".join(filter(None, (self.channel_errors, self.sweep_lock))),
            )
            warn_broker_timeouts(c.app, settings)
            _warn_rate_limits(c.app)
        started.warm(c.app)  # for tasks run in this process (threads, solo pools)
        try:
            service.store.ping()
        except Exception as exc:
            service.outage.failed(exc)  # the outage's one log line; tasks are held until it ends

    def stop(self, c: Any) -> None:
        if self.visibility is not None:
            self.visibility.stop()
        self.broker.stopped(c)
        if c.interval_service is not None:
            c.interval_service.connection_lost()

    def shutdown(self, c: Any) -> None:
        if c.interval_service is not None:
            c.interval_service.connection_lost()
            c.interval_service.close()
            c.interval_service = None


def _read_before_collect(c: Any) -> None:
    """Celery's handler of a broken channel restores its messages before the consumer stops
    (``connection.collect``, seconds): the service reads what it must first
    (``IntervalService.connection_breaking``). Wrapped once per consumer."""
    if getattr(c, "_interval_reads_first", False):
        return
    collect = c.on_connection_error_after_connected

    def on_connection_error_after_connected(exc: Any) -> Any:
        service = c.interval_service
        if service is not None:
            try:
                service.connection_breaking()
            except Exception:
                logger.exception("interval: reading marks before the reconnect failed")
        return collect(exc)

    c.on_connection_error_after_connected = on_connection_error_after_connected
    c._interval_reads_first = True
