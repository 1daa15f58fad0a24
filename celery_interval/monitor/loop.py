"""The exporter's loop: refresh the collector every interval, hand each frame to the server."""

from __future__ import annotations

import logging
import threading
import time

from celery_interval.monitor.collector import Collector
from celery_interval.monitor.prometheus import FrameMetrics

__all__ = ["run"]

logger = logging.getLogger(__name__)


def run(
    collector: Collector, metrics: FrameMetrics, interval_s: float, stop: threading.Event
) -> None:
    """Refresh ``collector`` every ``interval_s`` into ``metrics`` until ``stop`` is set; an
    unexpected error is logged and the loop goes on."""
    while not stop.is_set():
        began = time.monotonic()
        try:
            metrics.update(collector.refresh())
        except Exception:
            logger.exception("interval exporter: refresh failed")
        stop.wait(max(0.0, interval_s - (time.monotonic() - began)))
