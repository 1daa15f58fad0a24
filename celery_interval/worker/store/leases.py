"""Leases of started tasks that ack late: renewed while they run, ended when one is requeued."""

from __future__ import annotations

import logging
from typing import Any

from celery_interval.config import Settings
from celery_interval.errors import StoreError
from celery_interval.stores.base import Store
from celery_interval.worker.store.outage import StoreOutage

__all__ = ["Leases"]

logger = logging.getLogger("celery_interval.worker")


class Leases:
    """The leases this worker renews, by ``(bucket, task id, retries)``: each to its holder."""

    def __init__(self, settings: Settings, store: Store, timer: Any, outage: StoreOutage) -> None:
        self.settings = settings
        self.store = store
        self.timer = timer
        self.outage = outage
        self.holders: dict[tuple[str, str, int], str] = {}
        self._renew_entry: Any = None

    def hold(self, key: tuple[str, str, int], holder: str) -> None:
        """Renew this task's lease until it is done."""
        self.holders[key] = holder
        self._ensure_renew()

    def drop(self, key: tuple[str, str, int]) -> None:
        """Stop renewing this task's lease (it is done, or its end will never be reported)."""
        self.holders.pop(key, None)

    def end(self, bucket: str, task_id: str, retries: int) -> None:
        """The task was requeued (``Reject(requeue=True)``, a lost pool process): end its lease
        in the store too, so the copy the broker delivers again starts without waiting for it."""
        holder = self.holders.pop((bucket, task_id, retries), None)
        if holder is None:
            return
        try:
            self.store.renew(bucket, task_id, retries, holder, 0)
        except StoreError as exc:
            self.outage.failed(exc)
            logger.warning(
                "interval %s: task %s requeued; its copy waits for the lease to lapse (%.0fs)",
                bucket,
                task_id,
                self.settings.lease_us / 1e6,
            )

    def _ensure_renew(self) -> None:
        if self._renew_entry is None and self.holders:
            self._renew_entry = self.timer.call_after(
                self.settings.lease_us / 3e6, self._renew, priority=8
            )

    def _renew(self) -> None:
        self._renew_entry = None
        for (bucket, task_id, retries), holder in list(self.holders.items()):
            try:
                renewed = self.store.renew(bucket, task_id, retries, holder, self.settings.lease_us)
            except StoreError as exc:
                self.outage.failed(exc)
                break
            self.outage.answered()
            if not renewed:
                self.holders.pop((bucket, task_id, retries), None)
        self._ensure_renew()
