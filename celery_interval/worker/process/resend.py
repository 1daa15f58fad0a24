"""A message a running body sends in its own task's place (a throttle's copy, a retry, a
replacement), published however long the broker is down: the original is already acked."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["connect_pool", "connected_producer", "until_sent"]

logger = logging.getLogger("celery_interval.worker")


def until_sent(what: str, task_id: str) -> dict[str, Any]:
    """A publish retry policy that waits for a broker that is down, however long, logging one
    line the first time it waits; ``what`` names the message (``"retry of"``, …)."""
    told = False

    def errback(exc: Exception, interval_s: float) -> None:
        nonlocal told
        if not told:
            told = True
            logger.warning(
                "%s task %s waits for the broker to be sent (%r)",
                what,
                task_id,
                exc,
            )

    return {
        "max_retries": None,
        "interval_start": 0.1,
        "interval_step": 0.5,
        "interval_max": 2.0,
        "errback": errback,
    }


@contextmanager
def connected_producer(app: Any, policy: dict[str, Any]) -> Iterator[Any]:
    """A producer of ``app``'s pool, its connection made under ``policy``: kombu connects a
    producer's connection outside a publish's retry policy and gives up after
    ``broker_connection_timeout``, so a pool process that never published would lose the
    message to a broker down a few seconds."""
    with app.producer_or_acquire() as producer:
        producer.connection.ensure_connection(**policy)
        yield producer


def connect_pool(app: Any, policy: dict[str, Any]) -> None:
    """Connect, under ``policy``, the producer that ``app``'s next publish takes: the pool
    hands back the producer released last."""
    with connected_producer(app, policy):
        pass
