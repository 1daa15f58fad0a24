"""Register the consumer bootstep and the remote control commands with an app (idempotent)."""

from __future__ import annotations

from typing import Any

__all__ = ["install"]


def install(app: Any) -> None:
    """Add the interval bootstep to ``app``'s consumer; safe to call any number of times."""
    import celery_interval.worker.control  # noqa: F401  (registers the control commands)
    from celery_interval.worker.bootstep import IntervalStep

    app.steps["consumer"].add(IntervalStep)
