"""One app's buckets from a test: pause, unpause, re-time, status and starts, in one object."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from celery_interval import control
from celery_interval.schedule import Status
from celery_interval.testing.starts import Start, assert_spaced, ledger_starts, wait_for_starts

__all__ = ["IntervalControl"]


@dataclass
class IntervalControl:
    """Thin wrappers over ``celery_interval.control`` (the store, then a broadcast to live
    workers) and over the bucket ledger, bound to ``app``."""

    app: Any

    def pause(self, queue: str) -> Status:
        return control.pause(self.app, queue)

    def unpause(self, queue: str) -> Status:
        return control.unpause(self.app, queue)

    def set_interval(self, queue: str, interval: float | str) -> Status:
        """Override ``queue``'s interval in the store (seconds or a rate), for the whole pool."""
        return control.set_interval(self.app, queue, interval)

    def status(self, queue: str) -> Status:
        return control.status(self.app, queue)

    def starts(self, bucket: str) -> list[Start]:
        """``bucket``'s admitted starts so far, from its ledger, in start order."""
        return ledger_starts(self.app, bucket)

    def wait_for_starts(self, bucket: str, count: int, timeout_s: float = 30.0) -> list[Start]:
        """Wait until ``count`` tasks of ``bucket`` have started; their starts."""
        return wait_for_starts(self.app, bucket, count, timeout_s)

    def assert_spaced(
        self,
        bucket_or_starts: str | Sequence[Start],
        interval: float | str | None = None,
        *,
        in_order: bool = True,
    ) -> list[Start]:
        """``assert_spaced`` on a bucket's ledger (or on given starts); returns the starts."""
        starts = (
            self.starts(bucket_or_starts)
            if isinstance(bucket_or_starts, str)
            else list(bucket_or_starts)
        )
        assert_spaced(starts, interval, in_order=in_order)
        return starts
