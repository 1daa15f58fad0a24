"""celery_interval: one global start interval per Celery queue across a whole worker pool."""

from __future__ import annotations

from celery_interval.errors import (
    ConfigurationError,
    IntervalError,
    StoreError,
    StoreUnavailable,
    UnknownBucket,
)
from celery_interval.intervals import parse_interval_us

__all__ = [
    "ConfigurationError",
    "IntervalError",
    "StoreError",
    "StoreUnavailable",
    "UnknownBucket",
    "parse_interval_us",
]
