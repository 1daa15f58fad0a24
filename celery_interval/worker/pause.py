"""Paused buckets: tasks whose claim found their bucket paused wait here until it resumes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from celery_interval.config import Settings
from celery_interval.errors import StoreError
from celery_interval.schedule.outer import status_nested
from celery_interval.stores.base import Store
from celery_interval.worker.held import Held, HeldState
from celery_interval.worker.store.outage import StoreOutage
from celery_interval.worker.timer import cancel

__all__ = ["PausedTasks"]


class PausedTasks:
    """The tasks held because their bucket was paused, by bucket (iterating gives the buckets);
    each bucket's pause (and its outer bucket's) is polled in the store until it ends, then
    ``due`` claims its tasks."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        timer: Any,
        outage: StoreOutage,
        due: Callable[[Held], None],
    ) -> None:
        self.settings = settings
        self.store = store
        self.timer = timer
        self.outage = outage
        self._due = due
        self.held: dict[str, list[Held]] = defaultdict(list)
        self._polls: dict[str, Any] = {}

    def __iter__(self) -> Iterator[str]:
        return iter(self.held)

    def add(self, held: Held) -> None:
        """``held``'s claim found its bucket paused: it waits for the bucket to resume."""
        held.state = HeldState.PAUSED
        self.held[held.bucket].append(held)
        self._ensure_poll(held.bucket)

    def wake(self, bucket: str) -> None:
        """Re-claim every task held because ``bucket`` was paused (on unpause)."""
        waiting = self.held.pop(bucket, [])
        entry = self._polls.pop(bucket, None)
        if entry is not None:
            cancel(self.timer, entry)
        for held in sorted(waiting, key=lambda h: h.ticket):
            if held.state is HeldState.PAUSED:
                self._due(held)

    def _ensure_poll(self, bucket: str) -> None:
        if bucket not in self._polls:
            self._polls[bucket] = self.timer.call_after(
                self.settings.pause_poll_s, self._poll, (bucket,), priority=7
            )

    def _poll(self, bucket: str) -> None:
        self._polls.pop(bucket, None)
        if not self.held.get(bucket):
            return
        interval_us = self.held[bucket][0].interval_us
        try:
            paused = self._paused(bucket, interval_us)
        except StoreError as exc:
            self.outage.failed(exc)
            paused = True
        else:
            self.outage.answered()
        if paused:
            self._ensure_poll(bucket)
        else:
            self.wake(bucket)

    def _paused(self, bucket: str, interval_us: int) -> bool:
        """Whether ``bucket`` is still paused in the store, or its outer bucket is (a nested
        bucket's claims answer PAUSED while its outer is)."""
        status = self.store.status(bucket, interval_us)
        outer = self.settings.outer_of(bucket)
        if outer is None or status.paused:
            return status.paused
        return status_nested(
            status, self.store.status(outer.bucket, outer.interval_us), outer
        ).paused

    def clear(self) -> None:
        """The connection is gone: no task waits for its bucket to resume any more."""
        for entry in self._polls.values():
            cancel(self.timer, entry)
        self.held.clear()
        self._polls.clear()
