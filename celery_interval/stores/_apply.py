"""The Store protocol as "lock a bucket, load, apply a model function, save"."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol, TypeVar

from celery_interval import schedule
from celery_interval.schedule import (
    Backoff,
    BucketState,
    Claim,
    ClaimTerms,
    Grant,
    Mark,
    Pace,
    Places,
    Slot,
    Status,
    Unset,
)
from celery_interval.stores.base import DoneBatch, TaskCopy

__all__ = ["BucketTxn", "ModelStore"]

_R = TypeVar("_R")
#: A model operation on one copy's record: (state, mark, now_us, born_us) → (state, mark, result).
_Step = Callable[[BucketState | None, Mark | None, int, int], tuple[BucketState, Mark | None, _R]]

#: A model operation on one copy's record and its bucket's places:
#: (state, mark, places, now_us, born_us, places_born_us, settle_until_us)
#: → (state, mark, places, result).
_SeatStep = Callable[
    [BucketState | None, Mark | None, Places, int, int, int | None, int | None],
    tuple[BucketState, Mark | None, Places, _R],
]


class BucketTxn(Protocol):
    """One bucket's record loaded under its lock; changes are saved when the block exits cleanly.

    ``now_us`` is the store's clock, read once inside the lock. A state whose
    ``expires_real_us`` has passed loads as None.
    """

    now_us: int
    state: BucketState | None
    #: When the store may drop ``state`` (real µs; None: never).
    expires_real_us: int | None
    #: When the bucket was reset, while no state has been made since (else None).
    reset_us: int | None
    #: The places of the bodies running in a capped bucket (expired ones too); a reset or an
    #: expired state leaves them.
    places: Places

    def store_born_us(self) -> int:
        """The store's birth marker; when missing, ``now_us`` (kept if the block writes)."""
        ...

    def places_born_us(self) -> int | None:
        """``store_born_us`` as a capped claim reads it (``schedule.claim_capped``); None
        where the store keeps no marker."""
        ...

    def settle_until_us(self) -> int | None:
        """The end of the done marks' settle window (``schedule.places``), None: none."""
        ...

    def set_settle_until_us(self, until_us: int) -> None:
        """Keep ``until_us`` as the end of the done marks' settle window (store-wide)."""
        ...

    def mark(self, task_id: str, retries: int) -> Mark | None:
        """The mark of (task_id, retries), expired or not (the model checks expiry)."""
        ...

    def set_mark(self, task_id: str, retries: int, mark: Mark | None) -> None:
        """Store ``mark`` for (task_id, retries); None removes it."""
        ...


def _born_us(txn: BucketTxn) -> int:
    """The ``born_us`` of the model's operations: only a new state uses it, so the store's
    marker is read only then (``now_us`` otherwise, the value that assumes the least)."""
    if txn.state is not None:
        return txn.now_us
    born_us = txn.store_born_us()
    return born_us if txn.reset_us is None else max(born_us, txn.reset_us)


def _settle_until_us(txn: BucketTxn, terms: ClaimTerms) -> int | None:
    """The done marks' settle window's end once ``terms``' claimer came
    (``schedule.marks_settle_until_us``); kept in ``txn`` when it moved."""
    until_us = txn.settle_until_us()
    if terms.knew_born_us is None and not terms.redelivered:
        return until_us
    moved_us = schedule.marks_settle_until_us(
        terms.knew_born_us,
        txn.places_born_us(),
        until_us,
        txn.now_us,
        redelivered=terms.redelivered,
    )
    if moved_us is not None and moved_us != until_us:
        txn.set_settle_until_us(moved_us)
    return moved_us


def _put(txn: BucketTxn, state: BucketState, interval_us: int) -> None:
    """Save ``state``; a changed one is written, and a write sets when the store may drop it."""
    if state == txn.state:
        return
    txn.state = state
    txn.reset_us = None
    expires_in_us = schedule.expires_in_us(state, txn.now_us, interval_us)
    txn.expires_real_us = None if expires_in_us is None else txn.now_us + expires_in_us


def _status(txn: BucketTxn, interval_us: int, pace: Pace | None) -> Status:
    """``schedule.status`` of the record in ``txn``, counting its live places."""
    return schedule.status(
        txn.state, txn.now_us, interval_us, born_us=_born_us(txn), places=txn.places, pace=pace
    )


class ModelStore(ABC):
    """Every Store method as one ``schedule`` call inside one ``_locked(bucket)`` block.

    Subclasses supply only the lock, the clock, load and save; the algorithm stays in ``schedule``.
    """

    @abstractmethod
    def _locked(self, bucket: str, *, write: bool = True) -> AbstractContextManager[BucketTxn]:
        """Hold ``bucket``'s lock, yield its record; save it on clean exit when ``write``."""

    def _step(self, copy: TaskCopy, interval_us: int, step: _Step[_R]) -> _R:
        """``step`` on ``copy``'s mark and its bucket's state, under the bucket's lock; the
        state and mark it returns are saved."""
        with self._locked(copy.bucket) as txn:
            state, mark, result = step(
                txn.state, txn.mark(copy.task_id, copy.retries), txn.now_us, _born_us(txn)
            )
            _put(txn, state, interval_us)
            txn.set_mark(copy.task_id, copy.retries, mark)
            return result

    def _seated(
        self, copy: TaskCopy, interval_us: int, terms: ClaimTerms, step: _SeatStep[_R]
    ) -> _R:
        """``_step`` for a claiming step: it also reads and writes the bucket's places, and
        ``terms``' claimer may open the done marks' settle window (``_settle_until_us``)."""
        with self._locked(copy.bucket) as txn:
            settle_until_us = _settle_until_us(txn, terms)
            state, mark, txn.places, result = step(
                txn.state,
                txn.mark(copy.task_id, copy.retries),
                txn.places,
                txn.now_us,
                _born_us(txn),
                txn.places_born_us(),
                settle_until_us,
            )
            _put(txn, state, interval_us)
            txn.set_mark(copy.task_id, copy.retries, mark)
            return result

    def grant(self, copy: TaskCopy, pace: Pace) -> Grant:
        """Atomically take a ticket and slot (``schedule.grant``, idempotent per task copy)."""
        return self._step(
            copy, pace.interval_us, lambda s, m, n, b: schedule.grant(s, m, n, pace, born_us=b)
        )

    def claim(
        self, copy: TaskCopy, interval_us: int, slot: Slot, terms: ClaimTerms, *, ticket: int = 0
    ) -> Claim:
        """Atomically decide whether ``terms.holder``'s copy starts now (``schedule.claim``).

        ``ticket`` is for a store's ledger only; these stores keep none and ignore it.
        """
        return self._seated(
            copy,
            interval_us,
            terms,
            lambda s, m, p, n, b, pb, su: schedule.claim_capped(
                s,
                m,
                p,
                n,
                interval_us,
                slot,
                terms,
                place=copy.place,
                born_us=b,
                places_born_us=pb,
                settle_until_us=su,
            ),
        )

    def take(
        self, copy: TaskCopy, pace: Pace, terms: ClaimTerms, *, done_first: DoneBatch | None = None
    ) -> tuple[Grant, Claim | None]:
        """``schedule.take`` under the bucket's lock, after ``done_first`` is marked done."""
        if done_first is not None:
            self.done(done_first.copies, done_first.dedupe_ttl_us)

        def step(
            state: BucketState | None,
            mark: Mark | None,
            places: Places,
            now_us: int,
            born_us: int,
            places_born_us: int | None,
            settle_until_us: int | None,
        ) -> tuple[BucketState, Mark | None, Places, tuple[Grant, Claim | None]]:
            state, mark, places, granted, claimed = schedule.take_capped(
                state,
                mark,
                places,
                now_us,
                pace,
                terms,
                place=copy.place,
                born_us=born_us,
                places_born_us=places_born_us,
                settle_until_us=settle_until_us,
            )
            return state, mark, places, (granted, claimed)

        return self._seated(copy, pace.interval_us, terms, step)

    def done(self, copies: Sequence[TaskCopy], dedupe_ttl_us: int) -> None:
        """Mark each copy's message acknowledged; atomic per bucket (one lock per bucket in the
        batch)."""
        by_bucket: dict[str, list[TaskCopy]] = {}
        for copy in copies:
            by_bucket.setdefault(copy.bucket, []).append(copy)
        for bucket, group in by_bucket.items():
            with self._locked(bucket) as txn:
                for copy in group:
                    mark = txn.mark(copy.task_id, copy.retries)
                    txn.set_mark(
                        copy.task_id,
                        copy.retries,
                        schedule.done_mark(mark, txn.now_us, dedupe_ttl_us),
                    )

    #: A file store is shared by every process; MemoryStore says otherwise.
    posts_done = True

    def prepare_post(self) -> None:  # noqa: B027 (deliberately empty, not abstract)
        """Nothing to prepare: ``post_done`` works on a local file or memory at once."""

    def settle_post(self, timeout_s: float) -> None:  # noqa: B027 (deliberately empty)
        """Nothing to settle: ``post_done`` wrote the mark at once."""

    def post_done(self, copy: TaskCopy, dedupe_ttl_us: int) -> None:
        """``done`` at once: a local file or memory does not hang as a server can."""
        self.done([copy], dedupe_ttl_us)

    def renew(self, bucket: str, task_id: str, retries: int, holder: str, lease_us: int) -> bool:
        """Atomically extend ``holder``'s live lease to now + ``lease_us``; False if none."""
        with self._locked(bucket) as txn:
            mark, renewed = schedule.renew(txn.mark(task_id, retries), txn.now_us, holder, lease_us)
            txn.set_mark(task_id, retries, mark)
            return renewed

    def release(self, copy: TaskCopy) -> bool:
        """Atomically free the place of ``copy``'s body (``schedule.release``)."""
        with self._locked(copy.bucket) as txn:
            txn.places, released = schedule.release(txn.places, copy.place, txn.now_us)
            return released

    def renew_place(self, copy: TaskCopy, place_us: int, cap: int | None = None) -> bool:
        """Atomically extend (or take again, under ``cap``) the place of ``copy``'s body
        (``schedule.renew_place``)."""
        with self._locked(copy.bucket) as txn:
            txn.places, renewed = schedule.renew_place(
                txn.places, copy.place, txn.now_us, place_us, cap
            )
            return renewed

    def throttle(self, copy: TaskCopy, interval_us: int, backoff: Backoff) -> Status:
        """Atomically defer the bucket's starts and keep the first slot after for ``copy``
        (``schedule.throttle``)."""
        return self._step(
            copy,
            interval_us,
            lambda s, m, n, b: schedule.throttle(s, m, n, interval_us, backoff, born_us=b),
        )

    def pause(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Status:
        """Atomically freeze the bucket's virtual time (idempotent); returns the new status,
        read with ``pace`` as ``status`` reads it."""
        return self._update(
            bucket, interval_us, pace, lambda s, n, i, b: schedule.pause(s, n, i, born_us=b)
        )

    def unpause(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Status:
        """Atomically resume, shifting all granted slots by the pause length (idempotent)."""
        return self._update(
            bucket, interval_us, pace, lambda s, n, i, b: schedule.unpause(s, n, i, born_us=b)
        )

    def set_interval(
        self, bucket: str, interval_us: int, new_interval_us: int, pace: Pace | None = None
    ) -> Status:
        """Atomically override the bucket's interval with ``new_interval_us``."""
        return self._update(
            bucket,
            interval_us,
            pace,
            lambda s, n, i, b: schedule.set_interval(s, n, i, new_interval_us, born_us=b),
        )

    def unset_interval(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Unset:
        """Atomically drop the bucket's override; a bucket with none is left as it is."""
        with self._locked(bucket) as txn:
            state, dropped = schedule.unset_interval(txn.state, interval_us)
            if state is not None:
                _put(txn, state, interval_us)
                return Unset(_status(txn, interval_us, pace), dropped)
        # No state, nothing written: read it as ``status`` does (no birth marker is set).
        return Unset(self.status(bucket, interval_us, pace), dropped=False)

    def reset(self, bucket: str) -> None:
        """Atomically forget the bucket's state (marks are kept: dedupe survives a reset).

        The reset is remembered until the next state is made: that new epoch is born at the
        reset, so its first start waits one interval, as after a lost state.
        """
        with self._locked(bucket) as txn:
            txn.state = None
            txn.expires_real_us = None
            txn.reset_us = txn.now_us

    def status(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Status:
        """Read the bucket's state and count its live places without changing them."""
        with self._locked(bucket, write=False) as txn:
            return _status(txn, interval_us, pace)

    def _update(
        self,
        bucket: str,
        interval_us: int,
        pace: Pace | None,
        step: Callable[[BucketState | None, int, int, int], BucketState],
    ) -> Status:
        """``step`` on the bucket's state, saved; the status right after it, read with
        ``pace``."""
        with self._locked(bucket) as txn:
            _put(txn, step(txn.state, txn.now_us, interval_us, _born_us(txn)), interval_us)
            return _status(txn, interval_us, pace)
