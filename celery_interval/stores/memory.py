"""MemoryStore: the model behind a lock in one process, for tests and examples."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from celery_interval import schedule
from celery_interval.schedule import BucketState, Claim, Grant, Mark, Status
from celery_interval.stores.base import DoneMark

__all__ = ["MemoryStore"]


def _monotonic_us() -> int:
    return time.monotonic_ns() // 1000


class MemoryStore:
    """One process's store; its clock is ``clock_us`` (monotonic by default)."""

    def __init__(self, clock_us: Callable[[], int] = _monotonic_us) -> None:
        self._clock_us = clock_us
        self._lock = threading.Lock()
        self._states: dict[str, BucketState] = {}
        self._marks: dict[tuple[str, str, int], Mark] = {}

    def grant(
        self, bucket: str, task_id: str, retries: int, interval_us: int, not_before_in_us: int = 0
    ) -> Grant:
        with self._lock:
            now_us = self._clock_us()
            mark = self._marks.get((bucket, task_id, retries))
            state, result = schedule.grant(
                self._states.get(bucket), mark, now_us, interval_us, not_before_in_us
            )
            self._states[bucket] = state
            return result

    def claim(
        self,
        bucket: str,
        task_id: str,
        retries: int,
        interval_us: int,
        epoch: int,
        slot_us: int,
        holder: str,
        lease_us: int,
        lead_us: int = 0,
    ) -> Claim:
        with self._lock:
            now_us = self._clock_us()
            key = (bucket, task_id, retries)
            state, mark, result = schedule.claim(
                self._states.get(bucket),
                self._marks.get(key),
                now_us,
                interval_us,
                epoch,
                slot_us,
                holder,
                lease_us,
                lead_us,
            )
            self._states[bucket] = state
            self._put_mark(key, mark)
            return result

    def done(self, marks: Sequence[DoneMark], dedupe_ttl_us: int) -> None:
        with self._lock:
            now_us = self._clock_us()
            for m in marks:
                key = (m.bucket, m.task_id, m.retries)
                self._marks[key] = schedule.done(self._marks.get(key), now_us, dedupe_ttl_us)

    def renew(self, bucket: str, task_id: str, retries: int, holder: str, lease_us: int) -> bool:
        with self._lock:
            key = (bucket, task_id, retries)
            mark, renewed = schedule.renew(
                self._marks.get(key), self._clock_us(), holder, lease_us
            )
            self._put_mark(key, mark)
            return renewed

    def pause(self, bucket: str, interval_us: int) -> Status:
        return self._update(bucket, interval_us, schedule.pause)

    def unpause(self, bucket: str, interval_us: int) -> Status:
        return self._update(bucket, interval_us, schedule.unpause)

    def set_interval(self, bucket: str, interval_us: int, new_interval_us: int) -> Status:
        return self._update(
            bucket,
            interval_us,
            lambda s, now, i: schedule.set_interval(s, now, i, new_interval_us),
        )

    def reset(self, bucket: str) -> None:
        with self._lock:
            self._states.pop(bucket, None)

    def status(self, bucket: str, interval_us: int) -> Status:
        with self._lock:
            return schedule.status(self._states.get(bucket), self._clock_us(), interval_us)

    def ping(self) -> None:
        return None

    def close(self) -> None:
        return None

    def _update(
        self,
        bucket: str,
        interval_us: int,
        step: Callable[[BucketState | None, int, int], BucketState],
    ) -> Status:
        with self._lock:
            now_us = self._clock_us()
            state = step(self._states.get(bucket), now_us, interval_us)
            self._states[bucket] = state
            return schedule.status(state, now_us, interval_us)

    def _put_mark(self, key: tuple[str, str, int], mark: Mark | None) -> None:
        if mark is None:
            self._marks.pop(key, None)
        else:
            self._marks[key] = mark
