"""The broker's own list of overflow queues: parked tasks stay findable when the store forgets."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from celery_interval.buckets import overflow_queue_name
from celery_interval.errors import StoreUnavailable
from celery_interval.stores.overflow import OverflowIndex
from celery_interval.worker.broker.overflow_queues import OverflowBroker

__all__ = ["Directory"]

logger = logging.getLogger("celery_interval.worker")

#: How often a worker sweeps part of the directory (seconds) ...
SWEEP_S = 5.0
#: ... and how many entries at most per sweep: every entry is seen again well within
#: RabbitMQ's ``x-expires`` of an overflow queue (100,000 entries in under 5 hours by one
#: worker), and each sweep declares the queue it names, which renews that expiry.
SWEEP_BATCH = 32
#: An entry is dropped once its queue was found empty twice at least this far apart (seconds;
#: longer where the broker takes longer to return a dead worker's unacked messages).
MIN_EMPTY_S = 600.0


class Directory:
    """Registers the buckets this worker parks into, and sweeps the directory: a queue with
    tasks that the store's index does not list (a store that lost its state, a worker that
    died) is listed again, so a worker refills it; empty queues' entries are dropped."""

    def __init__(self, index: OverflowIndex) -> None:
        self.index = index
        #: When this worker last registered each bucket (monotonic s), this connection.
        self._registered: dict[tuple[str, str], float] = {}
        self._swept_s = 0.0
        self.found = 0

    def register(self, broker: OverflowBroker, members: list[tuple[str, str]]) -> None:
        """Add an entry for each bucket not registered here lately (parks renew it)."""
        now_s = time.monotonic()
        fresh = [m for m in members if now_s - self._registered.get(m, -1e18) >= MIN_EMPTY_S / 2]
        if not fresh:
            return
        try:
            broker.register([json.dumps(_entry(queue, bucket, None)) for queue, bucket in fresh])
        except Exception as exc:  # the next park registers it again
            logger.warning("interval: cannot register %d overflow queue(s): %r", len(fresh), exc)
            return
        for member in fresh:
            self._registered[member] = now_s

    def forget(self) -> None:
        """The connection went: register again on the next park."""
        self._registered.clear()

    def sweep_if_due(self, broker: OverflowBroker) -> None:
        """Sweep every ``SWEEP_S``; a broker error ends this sweep (the next looks again)."""
        if time.monotonic() - self._swept_s < SWEEP_S:
            return
        try:
            self.sweep(broker)
        except Exception as exc:  # the connection is going
            logger.debug("interval: overflow directory sweep stopped: %r", exc)

    def sweep(self, broker: OverflowBroker) -> None:
        """Look at up to ``SWEEP_BATCH`` entries: keep (and list) those whose queue has tasks,
        drop duplicates and those found empty ``MIN_EMPTY_S`` apart."""
        self._swept_s = time.monotonic()
        min_empty_s = max(MIN_EMPTY_S, 2 * broker.returns_unacked_within_s())
        seen: set[tuple[str, str]] = set()
        sweep = os.urandom(4).hex()
        for _ in range(SWEEP_BATCH):
            message = broker.take_entry()
            if message is None:
                return
            try:
                entry = json.loads(message.body)
                if entry.get("sweep") == sweep:  # round the whole directory already
                    message.requeue()
                    return
                kept = self._look(broker, entry, seen, min_empty_s)
            except StoreUnavailable:
                message.requeue()
                return
            except Exception as exc:
                logger.warning("interval: overflow directory entry kept as it was: %r", exc)
                message.requeue()
                return
            if kept is not None:
                broker.register([json.dumps({**kept, "sweep": sweep})])
            message.ack()

    def _look(
        self,
        broker: OverflowBroker,
        entry: dict[str, Any],
        seen: set[tuple[str, str]],
        min_empty_s: float,
    ) -> dict[str, Any] | None:
        """The entry to put back for one taken from the directory, or None to drop it."""
        queue, bucket = str(entry["queue"]), str(entry["bucket"])
        if (queue, bucket) in seen:
            return None
        seen.add((queue, bucket))
        if not broker.consumes(queue):  # another app's, or a queue this worker does not take
            return entry
        depth = broker.depth(overflow_queue_name(queue, bucket))
        if depth:
            if not self.index.changes(queue, bucket):
                self.index.park([(queue, bucket)])
                self.found += 1
                logger.warning(
                    "interval %s: %d parked task(s) the store did not list; listed again",
                    bucket,
                    depth,
                )
            return _entry(queue, bucket, None)
        empty_since_s = entry.get("empty_since_s")
        now_s = time.time()
        if empty_since_s is None:
            return _entry(queue, bucket, now_s)
        if now_s - float(empty_since_s) < min_empty_s or self.index.changes(queue, bucket):
            return _entry(queue, bucket, float(empty_since_s))
        return None


def _entry(queue: str, bucket: str, empty_since_s: float | None) -> dict[str, Any]:
    return {"queue": queue, "bucket": bucket, "empty_since_s": empty_since_s}
