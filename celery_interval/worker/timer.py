"""Cancelling an entry on the consumer's timer, which may have fired or gone already."""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["cancel"]

logger = logging.getLogger("celery_interval.worker")


def cancel(timer: Any, entry: Any) -> None:
    try:
        timer.cancel(entry)
    except Exception:  # pragma: no cover - a timer that already fired or is gone
        logger.debug("interval: timer entry already gone", exc_info=True)
