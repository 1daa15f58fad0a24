"""MemoryStore: the model behind a lock in one process, for tests and examples."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from celery_interval.schedule import BucketState, Mark
from celery_interval.stores._apply import BucketTxn, ModelStore

__all__ = ["MemoryStore"]


def _monotonic_us() -> int:
    return time.monotonic_ns() // 1000


class _MemoryTxn:
    """A bucket's view onto the store's dicts; ``state`` is written back on a clean exit."""

    def __init__(self, store: MemoryStore, bucket: str, now_us: int) -> None:
        self._store = store
        self._bucket = bucket
        self.now_us = now_us
        self.state: BucketState | None = store._states.get(bucket)

    def mark(self, task_id: str, retries: int) -> Mark | None:
        return self._store._marks.get((self._bucket, task_id, retries))

    def set_mark(self, task_id: str, retries: int, mark: Mark | None) -> None:
        key = (self._bucket, task_id, retries)
        if mark is None:
            self._store._marks.pop(key, None)
        else:
            self._store._marks[key] = mark


class MemoryStore(ModelStore):
    """One process's store; its clock is ``clock_us`` (monotonic by default)."""

    #: A pool process's post would land in its own copy.
    posts_done = False

    def __init__(self, clock_us: Callable[[], int] = _monotonic_us) -> None:
        self._clock_us = clock_us
        self._lock = threading.Lock()
        self._states: dict[str, BucketState] = {}
        self._marks: dict[tuple[str, str, int], Mark] = {}

    @contextmanager
    def _locked(self, bucket: str, *, write: bool = True) -> Iterator[BucketTxn]:
        with self._lock:
            txn = _MemoryTxn(self, bucket, self._clock_us())
            yield txn
            if not write:
                return
            if txn.state is None:
                self._states.pop(bucket, None)
            else:
                self._states[bucket] = txn.state

    def ping(self) -> None:
        return None

    def close(self) -> None:
        return None
