"""What a worker holds, by bucket: held tasks, their counters, and fetching stopped at the caps."""

from __future__ import annotations

import contextlib
import heapq
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery_interval.config import Settings
from celery_interval.schedule import Limits
from celery_interval.worker.held import Held

if TYPE_CHECKING:
    from celery_interval.worker.broker.parking import Parking

__all__ = ["BucketStats", "Holding"]

#: Counters are kept for at most this many buckets that hold nothing here.
MAX_STATS = 10_000


@dataclass
class BucketStats:
    """Counters of one bucket on this worker, reported by ``inspect interval_stats``."""

    grants: int = 0
    claims: int = 0
    waits: int = 0
    paused: int = 0
    helds: int = 0
    retickets: int = 0
    duplicates: int = 0
    interval_us: int = 0
    #: The bucket's burst (units), as its last held task carried it.
    burst: int = 1
    #: The bucket's extra limits, as its last held task carried them.
    limits: Limits = ()
    last_paused: bool = False


class Holding:
    """The held tasks of each bucket, their counters, and the queues this worker stopped
    consuming because a bucket held too many tasks or too far ahead."""

    def __init__(
        self,
        settings: Settings,
        qos: Callable[[], Any],
        stop_queue: Callable[[str], None],
        resume_queue: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self._qos = qos
        self._stop_queue = stop_queue
        self._resume_queue = resume_queue
        self.held: dict[str, list[Held]] = defaultdict(list)
        self.count = 0
        self.stats: dict[str, BucketStats] = defaultdict(BucketStats)
        self.stopped: set[str] = set()
        self.latest_due_ns: dict[str, int] = {}
        #: Set by the service when parking is on: told when a held task leaves.
        self.parking: Parking | None = None
        #: By queue: its buckets holding more than half ``max_held`` (they keep it stopped).
        self._crowded: dict[str, set[str]] = defaultdict(set)
        #: By queue: a max-heap of (-due_ns, bucket); entries whose bucket holds nothing or
        #: has a later due are stale and dropped as they reach the top.
        self._dues: dict[str, list[tuple[int, str]]] = defaultdict(list)

    def held_in(self, bucket: str) -> int:
        """How many tasks of ``bucket`` this worker holds."""
        return len(self.held.get(bucket, ()))

    def held_total(self) -> int:
        """How many tasks this worker holds in all."""
        return self.count

    def add(self, held: Held) -> None:
        """Hold ``held``: its message stays unacked, so the prefetch makes room for it."""
        items = self.held[held.bucket]
        items.append(held)
        self.count += 1
        self._qos().increment_eventually()
        if held.queue and len(items) > self.settings.max_held // 2:
            self._crowded[held.queue].add(held.bucket)

    def remove(self, held: Held) -> bool:
        """Let go of ``held`` (if still held), and apply the caps to its queue. Returns whether
        its bucket holds nothing here now (its entries were dropped)."""
        emptied = False
        with contextlib.suppress(ValueError):  # already let go
            items = self.held.get(held.bucket, [])
            items.remove(held)
            self.count -= 1
            self._qos().decrement_eventually()
            if held.queue and len(items) <= self.settings.max_held // 2:
                self._crowded[held.queue].discard(held.bucket)
            if not items:
                self._prune(held.bucket)
                emptied = True
            if self.parking is not None:
                self.parking.left(held.queue, held.bucket)
        self.apply_caps(held.queue, held.bucket)
        return emptied

    def due_at(self, bucket: str, due_ns: int) -> None:
        """A task of ``bucket`` starts at ``due_ns`` (monotonic): how far ahead the bucket holds
        (a bucket that holds nothing here any more is not this worker's to count)."""
        items = self.held.get(bucket)
        if not items or not items[0].queue:
            return
        latest_ns = max(due_ns, self.latest_due_ns.get(bucket, 0))
        self.latest_due_ns[bucket] = latest_ns
        dues = self._dues[items[0].queue]
        heapq.heappush(dues, (-latest_ns, bucket))
        if len(dues) > 2 * len(self.latest_due_ns) + 64:  # stale entries: rebuild
            dues[:] = [(-self.latest_due_ns[b], b) for b in {b for _, b in dues}
                       if b in self.latest_due_ns]  # fmt: skip
            heapq.heapify(dues)

    def _prune(self, bucket: str) -> None:
        """A bucket holds nothing here: drop its entries (many tenants come and go); keep its
        counters while fewer than ``MAX_STATS`` buckets have them."""
        self.held.pop(bucket, None)
        self.latest_due_ns.pop(bucket, None)
        if len(self.stats) > MAX_STATS:
            self.stats.pop(bucket, None)

    def _latest_due_ns(self, queue: str) -> int | None:
        """The latest start any bucket of ``queue`` holds a task for (None: none known)."""
        dues = self._dues.get(queue)
        while dues:
            due_ns, bucket = -dues[0][0], dues[0][1]
            if self.latest_due_ns.get(bucket) == due_ns and self.held.get(bucket):
                return due_ns
            heapq.heappop(dues)
        return None

    def apply_caps(self, queue: str | None, bucket: str | None = None) -> None:
        """Stop fetching at ``max_held`` tasks of a bucket or a slot ``max_ahead_s`` away;
        resume at half of both. Half leaves a buffer for the broker's resume latency (a Redis
        broker's BRPOP: up to 1 s). Only ``bucket``, the one that changed, can newly reach a
        cap; resuming reads the queue's crowded buckets and its latest start."""
        if not queue:
            return
        if self.parking is not None and self.parking.active:
            if queue in self.stopped:  # stopped while parking was out
                self.stopped.discard(queue)
                self._resume_queue(queue)
            return
        now_ns = time.monotonic_ns()
        latest_ns = self._latest_due_ns(queue)
        ahead_s = 0.0 if latest_ns is None else (latest_ns - now_ns) / 1e9
        if queue not in self.stopped:
            count = len(self.held.get(bucket, ())) if bucket is not None else 0
            if count >= self.settings.max_held or ahead_s >= self.settings.max_ahead_s:
                self.stopped.add(queue)
                self._stop_queue(queue)
        elif not self._crowded.get(queue) and ahead_s <= self.settings.max_ahead_s / 2:
            self.stopped.discard(queue)
            self._resume_queue(queue)

    def clear(self) -> None:
        """The connection is gone: every held message returns to the broker."""
        self.held.clear()
        self.count = 0
        self.stopped.clear()
        self._crowded.clear()
        self._dues.clear()
        self.latest_due_ns.clear()
