"""The worker's start-up banner: its interval queues, their intervals and the store."""

from __future__ import annotations

import logging
from typing import Any

from celery_interval.config import settings_of
from celery_interval.config.intervals import describe_interval
from celery_interval.errors import ConfigurationError
from celery_interval.stores import mask_url

__all__ = ["banner_text", "extend_banner"]

logger = logging.getLogger("celery_interval.worker")


def banner_text(app: Any) -> str:
    """The ``[interval queues]`` section: each interval queue, said when this worker does not
    consume it, then the store, password masked."""
    settings = settings_of(app)
    consumed = set(getattr(app.amqp.queues, "consume_from", None) or ())
    lines = [
        f"  . {queue}: {describe_interval(interval_us)}"
        + ("" if queue in consumed else "; not consumed here")
        for queue, interval_us in sorted(settings.queues_us.items())
    ]
    lines.append(f"  . store: {mask_url(settings.store_url)}")
    return "\n[interval queues]\n" + "\n".join(lines) + "\n"


def extend_banner(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """``celeryd_after_setup``: add ``banner_text`` to the worker's banner, after its tasks."""
    if instance is None or not hasattr(instance, "extra_info"):
        return
    try:
        text = banner_text(instance.app)
    except ConfigurationError:  # the bootstep reports it, with the key, as the worker starts
        return
    extra_info = instance.extra_info
    instance.extra_info = lambda: (extra_info() or "") + text
