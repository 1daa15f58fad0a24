"""The startup check that held tasks cannot outlive the broker's redelivery timeout."""

from __future__ import annotations

import logging
from typing import Any

from celery_interval.config import Settings

__all__ = ["broker_timeout_s", "warn_broker_timeouts"]

logger = logging.getLogger("celery_interval.worker")

#: RabbitMQ's default ``consumer_timeout`` (30 minutes); override with interval_broker_timeout_s.
RABBITMQ_CONSUMER_TIMEOUT_S = 1800.0
#: kombu's default Redis ``visibility_timeout``.
REDIS_VISIBILITY_TIMEOUT_S = 3600.0


def broker_timeout_s(app: Any, settings: Settings) -> tuple[float, str] | None:
    """The broker's redelivery timeout for unacked messages and the setting that controls it."""
    if settings.broker_timeout_s is not None:
        return settings.broker_timeout_s, "interval_broker_timeout_s"
    url = str(app.conf.broker_url or "")
    if url.startswith(("redis://", "rediss://", "sentinel://")):
        options = app.conf.broker_transport_options or {}
        return (
            float(options.get("visibility_timeout", REDIS_VISIBILITY_TIMEOUT_S)),
            "broker_transport_options['visibility_timeout']",
        )
    if url.startswith(("amqp://", "amqps://", "pyamqp://")):
        return RABBITMQ_CONSUMER_TIMEOUT_S, "RabbitMQ consumer_timeout (rabbitmq.conf)"
    return None


def warn_broker_timeouts(app: Any, settings: Settings) -> None:
    """Warn once per bucket whose worst-case hold can exceed the broker's timeout."""
    found = broker_timeout_s(app, settings)
    if found is None:
        return
    timeout_s, setting = found
    for bucket, interval_us in settings.queues_us.items():
        hold_s = settings.max_held * interval_us / 1e6
        if hold_s >= timeout_s:
            logger.warning(
                "interval %s: interval_max_held (%d) x interval (%.3fs) = %.0fs can exceed the "
                "broker's redelivery timeout %.0fs: lower interval_max_held or raise %s",
                bucket,
                settings.max_held,
                interval_us / 1e6,
                hold_s,
                timeout_s,
                setting,
            )
