"""The startup check that held tasks cannot outlive the broker's redelivery timeout."""

from __future__ import annotations

import logging
from typing import Any

from celery_interval.config import Settings

__all__ = ["broker_timeout_s", "warn_broker_timeouts"]

logger = logging.getLogger("celery_interval.worker")

#: RabbitMQ's default ``consumer_timeout`` (30 minutes); override with interval_broker_timeout_s.
RABBITMQ_CONSUMER_TIMEOUT_S = 1800.0


def broker_timeout_s(app: Any, settings: Settings) -> tuple[float, str] | None:
    """The broker's redelivery timeout for unacked messages and the setting that controls it.
    None on a Redis broker: a live worker keeps refreshing its messages' scores
    (``visibility.py``), so no hold outlives ``visibility_timeout``."""
    if settings.broker_timeout_s is not None:
        return settings.broker_timeout_s, "interval_broker_timeout_s"
    url = str(app.conf.broker_url or "")
    if url.startswith(("amqp://", "amqps://", "pyamqp://")):
        return RABBITMQ_CONSUMER_TIMEOUT_S, "RabbitMQ consumer_timeout (rabbitmq.conf)"
    return None


def warn_broker_timeouts(app: Any, settings: Settings) -> None:
    """Warn when a held task's wait can pass the broker's redelivery timeout: with parking, the
    bucket's hold cap times its interval; without, ``max_ahead_s`` and one interval more. The
    dedupe still prevents double runs, but slots are wasted."""
    from celery_interval.worker.broker.parking import hold_cap

    found = broker_timeout_s(app, settings)
    if found is None:
        return
    timeout_s, setting = found
    for bucket, interval_us in settings.queues_us.items():
        if settings.overflow:
            hold_s = hold_cap(settings, interval_us) * interval_us / 1e6
            lower = "interval_hold_ahead_s"
        else:
            hold_s = settings.max_ahead_s + interval_us / 1e6
            lower = "interval_max_ahead_s"
        if hold_s >= timeout_s:
            logger.warning(
                "interval %s: a held task may wait %.0fs, longer than the broker's redelivery "
                "timeout %.0fs: lower %s or raise %s",
                bucket,
                hold_s,
                timeout_s,
                lower,
                setting,
            )
