"""MemoryStore: the model behind a lock in one process, for tests and examples."""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from celery_interval.schedule import BucketState, Mark, Places
from celery_interval.schedule.fair import FairShare
from celery_interval.stores._apply import BucketTxn
from celery_interval.stores.nested import NestedSteps, Nesting
from celery_interval.stores.overflow import MemoryOverflowIndex

__all__ = ["MemoryStore"]


def _monotonic_us() -> int:
    return time.monotonic_ns() // 1000


class _MemoryTxn:
    """A bucket's view onto the store's dicts; its record is written back on a clean exit."""

    def __init__(self, store: MemoryStore, bucket: str, now_us: int, write: bool) -> None:
        self._store = store
        self._bucket = bucket
        self._write = write
        self.now_us = now_us
        self.state: BucketState | None = store._states.get(bucket)
        self.expires_real_us: int | None = store._expires_real_us.get(bucket)
        self.reset_us: int | None = store._reset_us.get(bucket)
        self.places: Places = store._places.get(bucket, ())

    def store_born_us(self) -> int:
        return self._store._store_born_us(self.now_us, self._write)

    def places_born_us(self) -> int | None:
        return self._store._places_born_us(self.now_us, self._write)

    def settle_until_us(self) -> int | None:
        return self._store._settle_until_us

    def set_settle_until_us(self, until_us: int) -> None:
        self._store._settle_until_us = until_us

    def mark(self, task_id: str, retries: int) -> Mark | None:
        return self._store._marks.get((self._bucket, task_id, retries))

    def set_mark(self, task_id: str, retries: int, mark: Mark | None) -> None:
        key = (self._bucket, task_id, retries)
        if mark is None:
            self._store._marks.pop(key, None)
        else:
            self._store._marks[key] = mark


class MemoryStore(NestedSteps):
    """One process's store; its clock is ``clock_us`` (monotonic by default).

    Its birth marker is set by the first operation that makes a bucket's state, so a new
    store's first buckets wait one interval, as a new Redis would. An idle state is dropped
    when ``schedule.expires_in_us`` says so (at the next operation on any bucket); expired
    marks are dropped only when their task is seen again.
    """

    #: A pool process's post would land in its own copy.
    posts_done = False

    def __init__(
        self, clock_us: Callable[[], int] = _monotonic_us, *, nesting: Nesting | None = None
    ) -> None:
        """``nesting`` gives a nested bucket's outer bucket (None: not nested)."""
        self._clock_us = clock_us
        self._nesting = nesting
        self._lock = threading.Lock()
        self._born: int | None = None
        self._settle_until_us: int | None = None
        self._states: dict[str, BucketState] = {}
        self._expires_real_us: dict[str, int] = {}
        self._expiries: list[tuple[int, str]] = []  # a heap of (expires_real_us, bucket)
        self._reset_us: dict[str, int] = {}
        self._marks: dict[tuple[str, str, int], Mark] = {}
        self._places: dict[str, Places] = {}
        self._shares = {}
        #: Which buckets have parked tasks (every worker of this process shares it).
        self.overflow_index = MemoryOverflowIndex()

    def read_state(self, bucket: str) -> BucketState | None:
        """The bucket's state, or None (also once it expired); for tests and debugging."""
        with self._locked(bucket, write=False) as txn:
            return txn.state

    def read_mark(self, bucket: str, task_id: str, retries: int) -> Mark | None:
        """The stored mark of (task_id, retries), expired or not, or None."""
        with self._locked(bucket, write=False) as txn:
            return txn.mark(task_id, retries)

    def read_places(self, bucket: str) -> Places:
        """The bucket's places as stored (expired ones until an operation drops them)."""
        with self._locked(bucket, write=False) as txn:
            return txn.places

    def buckets(self) -> list[str]:
        """The buckets this store holds a state for (expired ones may still be listed)."""
        with self._lock:
            return list(self._states)

    def _places_born_us(self, now_us: int, write: bool) -> int | None:
        return self._store_born_us(now_us, write)

    def _store_born_us(self, now_us: int, write: bool) -> int:
        if self._born is None:
            if not write:
                return now_us
            self._born = now_us
        return self._born

    def _drop_expired(self, now_us: int) -> None:
        while self._expiries and self._expiries[0][0] <= now_us:
            expires_us, bucket = heapq.heappop(self._expiries)
            if self._expires_real_us.get(bucket) == expires_us:
                del self._expires_real_us[bucket]
                del self._states[bucket]

    @contextmanager
    def _locked(self, bucket: str, *, write: bool = True) -> Iterator[BucketTxn]:
        with self._lock:
            now_us = self._clock_us()
            self._drop_expired(now_us)  # so a state loads only while it is not expired
            txn = _MemoryTxn(self, bucket, now_us, write)
            yield txn
            if write:
                self._save(bucket, txn)

    @contextmanager
    def _locked_pair(self, inner: str, outer: str) -> Iterator[tuple[BucketTxn, BucketTxn]]:
        """Both buckets' records under the store's one lock, on one clock reading."""
        with self._lock:
            now_us = self._clock_us()
            self._drop_expired(now_us)
            txns = _MemoryTxn(self, inner, now_us, True), _MemoryTxn(self, outer, now_us, True)
            yield txns
            self._save(inner, txns[0])
            self._save(outer, txns[1])

    def _save(self, bucket: str, txn: _MemoryTxn) -> None:
        """Write ``txn``'s record of ``bucket`` back (under the lock)."""
        if txn.state is None:
            self._states.pop(bucket, None)
        else:
            self._states[bucket] = txn.state
        if txn.expires_real_us is None:
            self._expires_real_us.pop(bucket, None)
        elif self._expires_real_us.get(bucket) != txn.expires_real_us:
            self._expires_real_us[bucket] = txn.expires_real_us
            heapq.heappush(self._expiries, (txn.expires_real_us, bucket))
        if txn.places:
            self._places[bucket] = txn.places
        else:
            self._places.pop(bucket, None)
        if txn.reset_us is None:
            self._reset_us.pop(bucket, None)
        else:
            self._reset_us[bucket] = txn.reset_us

    def read_fair(self, outer: str) -> tuple[FairShare, int]:
        """An outer bucket's fair share as stored (empty: none), and the store's clock (µs)."""
        with self._lock:
            return self._shares.get(outer, FairShare()), self._clock_us()

    def born_us(self) -> int | None:
        with self._lock:
            return self._born

    def ping(self) -> None:
        return None

    def close(self) -> None:
        return None
