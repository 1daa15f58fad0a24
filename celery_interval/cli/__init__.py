"""Command lines: ``celery -A proj interval …`` and the ``celery-interval`` program."""

from __future__ import annotations

from celery_interval.cli.interval import interval
from celery_interval.cli.tool import main

__all__ = ["interval", "main"]
