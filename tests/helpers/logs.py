"""Reading the worker's log records in-process (no Celery worker around it)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def worker_log() -> Iterator[list[logging.LogRecord]]:
    """The celery_interval.worker records at WARNING and above (read
    directly: a Celery app set up earlier may have raised the root logger's level, which the
    caplog fixture would not see past)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    log = logging.getLogger("celery_interval.worker")
    level = log.level
    log.setLevel(logging.WARNING)
    log.addHandler(handler)
    try:
        yield records
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
