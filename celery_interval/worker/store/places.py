"""Places of capped buckets' running bodies: renewed while each body runs, freed when it ends."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from celery_interval.config import Settings
from celery_interval.errors import StoreError
from celery_interval.schedule import PLACE_RENEW_US
from celery_interval.stores.base import Store, TaskCopy
from celery_interval.worker.store.outage import StoreOutage

__all__ = ["RunningPlaces"]

logger = logging.getLogger("celery_interval.worker")


class RunningPlaces:
    """The places this worker's bodies hold, by request (its object: a retry of a task shares
    its id while the body that sent it still runs): each renewed every third of
    ``interval_lease_s``, at least every ``PLACE_RENEW_US`` (taken again if the store lost it),
    while its body runs and released when it ends; a place this worker cannot release (store
    down, worker killed) comes back when it expires."""

    def __init__(self, settings: Settings, store: Store, timer: Any, outage: StoreOutage) -> None:
        self.settings = settings
        self.store = store
        self.timer = timer
        self.outage = outage
        #: id(request) → (request, its copy, its bucket's cap); the request is kept so its id
        #: is not reused.
        self.running: dict[int, tuple[Any, TaskCopy, int]] = {}
        self._renew_entry: Any = None

    def by_bucket(self) -> Counter[str]:
        """How many bodies hold a place here, by bucket."""
        return Counter(copy.bucket for _request, copy, _cap in self.running.values())

    def hold(self, request: Any, copy: TaskCopy, cap: int) -> None:
        """The body of ``copy`` was handed to the pool under its place in a bucket of ``cap``
        places: renew it until it ends."""
        self.running[id(request)] = (request, copy, cap)
        if self._renew_entry is None:
            self._renew_entry = self.timer.call_after(self._every_s(), self._renew, priority=8)

    def drop(self, request: Any) -> None:
        """Stop renewing this body's place (its end will never be reported): it comes back
        when it expires, as a dead worker's does."""
        self.running.pop(id(request), None)

    def free(self, request: Any) -> str | None:
        """The body ended: release its place at once; its bucket, or None if it held none."""
        entry = self.running.pop(id(request), None)
        if entry is None:
            return None
        copy = entry[1]
        try:
            self.store.release(copy)
        except StoreError as exc:
            self.outage.failed(exc)
            logger.warning(
                "interval %s: task %s ended; its place comes back when it expires (%.0fs)",
                copy.bucket,
                copy.task_id,
                self.settings.lease_us / 1e6,
            )
        return copy.bucket

    def _every_s(self) -> float:
        return min(self.settings.lease_us / 3, PLACE_RENEW_US) / 1e6

    def _renew(self) -> None:
        self._renew_entry = None
        for key, (_request, copy, cap) in list(self.running.items()):
            try:
                renewed = self.store.renew_place(copy, self.settings.lease_us, cap)
            except StoreError as exc:
                self.outage.failed(exc)
                break
            self.outage.answered()
            if not renewed:
                self.running.pop(key, None)
                logger.warning(
                    "interval %s: task %s lost its place (it expired while the body ran, and "
                    "the bucket's %d places are taken)",
                    copy.bucket,
                    copy.task_id,
                    cap,
                )
        if self.running:
            self._renew_entry = self.timer.call_after(self._every_s(), self._renew, priority=8)
