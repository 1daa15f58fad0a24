"""Store call times from the workers' ``interval-granted``/``-claimed`` events, consumed on a
thread with Celery's event receiver."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from fnmatch import fnmatchcase
from typing import Any

from celery_interval.buckets import queue_of
from celery_interval.monitor.histogram import STORE_CALL_BOUNDS_S, Histogram

__all__ = ["EVENT_TYPES", "STORE_OPS", "StoreCallEvents"]

logger = logging.getLogger(__name__)

#: The event types that carry a store call's ``store_op`` and ``store_s``.
EVENT_TYPES = ("interval-granted", "interval-claimed")
#: The store calls they name: a ticket, a ticket and its claim in one trip, a claim.
STORE_OPS = frozenset({"grant", "take", "claim"})
#: Seconds between reconnection attempts when the broker is away.
RETRY_S = 1.0


class StoreCallEvents:
    """Histograms of ``store_s`` per ``(bucket, queue, op)`` of the events whose bucket matches
    ``match``; ``start`` runs the consumer on a daemon thread until ``stop``."""

    def __init__(self, app: Any, match: str = "*") -> None:
        self._app = app
        self._match = match
        self._lock = threading.Lock()
        self.histograms: dict[tuple[str, str, str], Histogram] = {}
        self.received = 0
        self.malformed = 0
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._receiver: Any = None
        self._thread: threading.Thread | None = None

    def handlers(self) -> dict[str, Callable[[dict[str, Any]], None]]:
        """The receiver's handlers, keyed by event type."""
        return dict.fromkeys(EVENT_TYPES, self.record)

    def record(self, event: dict[str, Any]) -> None:
        """Count one event's ``store_s`` under its ``store_op``; an event of no store call of
        its own (a claim made in its grant's trip) is skipped, one with a bad field is counted
        as malformed and left out."""
        if "store_op" not in event and "store_s" not in event:
            return
        bucket, seconds, op = event.get("bucket"), event.get("store_s"), event.get("store_op")
        if (
            not isinstance(bucket, str)
            or not bucket
            or not isinstance(seconds, (int, float))
            or op not in STORE_OPS
        ):
            with self._lock:
                self.malformed += 1
            return
        if not fnmatchcase(bucket, self._match):
            return
        queue = event.get("queue")
        key = (bucket, queue if isinstance(queue, str) and queue else queue_of(bucket), op)
        with self._lock:
            self.received += 1
            histogram = self.histograms.get(key)
            if histogram is None:
                histogram = self.histograms[key] = Histogram(STORE_CALL_BOUNDS_S)
        histogram.observe(float(seconds))

    def snapshot(self) -> dict[tuple[str, str, str], Histogram]:
        """The histograms by ``(bucket, queue, op)`` (each safe to read while it grows)."""
        with self._lock:
            return dict(self.histograms)

    def start(self) -> None:
        """Consume events on a daemon thread (reconnecting while the broker is away)."""
        self._thread = threading.Thread(target=self._run, name="interval-events", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the consumer (it notices within a second) and wait for it."""
        self._stop.set()
        if self._receiver is not None:
            self._receiver.should_stop = True
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            try:
                with self._app.connection_for_read() as conn:
                    receiver = self._app.events.Receiver(conn, handlers=self.handlers())
                    ready = receiver.on_consume_ready

                    def on_ready(*args: Any, _ready: Any = ready, **kwargs: Any) -> None:
                        _ready(*args, **kwargs)
                        self.ready.set()

                    receiver.on_consume_ready = on_ready
                    self._receiver = receiver
                    if self._stop.is_set():
                        return
                    if failing:
                        logger.warning("interval exporter: event stream back")
                        failing = False
                    receiver.capture(limit=None, timeout=None, wakeup=False)
            except Exception as exc:
                self.ready.clear()
                if not failing:
                    logger.warning("interval exporter: event stream lost (%s); retrying", exc)
                    failing = True
                self._stop.wait(RETRY_S)
