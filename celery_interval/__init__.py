"""celery_interval: one global start interval per Celery queue across a whole worker pool."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

import celery_interval.worker.control as _control_commands  # noqa: F401  (registers commands)
from celery_interval.config import Bucket, parse_interval_us
from celery_interval.control import pause, reset, set_interval, status, unpause, unset_interval
from celery_interval.errors import (
    ConfigurationError,
    IntervalError,
    StoreError,
    StoreRefused,
    StoreUnavailable,
    TransientError,
    UnknownBucket,
)
from celery_interval.inline import SlotTimeout, slot
from celery_interval.install import install
from celery_interval.task import IntervalTask
from celery_interval.throttled import Throttled

try:
    __version__ = _version("celery-interval")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "Bucket",
    "ConfigurationError",
    "IntervalError",
    "IntervalTask",
    "SlotTimeout",
    "StoreError",
    "StoreRefused",
    "StoreUnavailable",
    "Throttled",
    "TransientError",
    "UnknownBucket",
    "install",
    "parse_interval_us",
    "pause",
    "reset",
    "set_interval",
    "slot",
    "status",
    "unpause",
    "unset_interval",
]
