"""The Store protocol as "lock a bucket, load, apply a schedule.py function, save"."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from celery_interval import schedule
from celery_interval.schedule import BucketState, Claim, Grant, Mark, Status
from celery_interval.stores.base import DoneMark

__all__ = ["BucketTxn", "ModelStore"]


class BucketTxn(Protocol):
    """One bucket's record loaded under its lock; changes are saved when the block exits cleanly.

    ``now_us`` is the store's clock, read once inside the lock.
    """

    now_us: int
    state: BucketState | None

    def mark(self, task_id: str, retries: int) -> Mark | None:
        """The mark of (task_id, retries), expired or not (the model checks expiry)."""
        ...

    def set_mark(self, task_id: str, retries: int, mark: Mark | None) -> None:
        """Store ``mark`` for (task_id, retries); None removes it."""
        ...


class ModelStore(ABC):
    """Every Store method as one ``schedule`` call inside one ``_locked(bucket)`` block.

    Subclasses supply only the lock, the clock, load and save; the algorithm stays in schedule.py.
    """

    @abstractmethod
    def _locked(self, bucket: str, *, write: bool = True) -> AbstractContextManager[BucketTxn]:
        """Hold ``bucket``'s lock, yield its record; save it on clean exit when ``write``."""

    def grant(
        self, bucket: str, task_id: str, retries: int, interval_us: int, not_before_in_us: int = 0
    ) -> Grant:
        """Atomically take a ticket and slot (``schedule.grant``, idempotent per task copy)."""
        with self._locked(bucket) as txn:
            txn.state, mark, result = schedule.grant(
                txn.state, txn.mark(task_id, retries), txn.now_us, interval_us, not_before_in_us
            )
            txn.set_mark(task_id, retries, mark)
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
        *,
        ticket: int = 0,
        handoff_us: int = 0,
    ) -> Claim:
        """Atomically decide whether ``holder``'s copy starts now (``schedule.claim``).

        ``ticket`` is for a store's ledger only; these stores keep none and ignore it.
        """
        with self._locked(bucket) as txn:
            txn.state, mark, result = schedule.claim(
                txn.state,
                txn.mark(task_id, retries),
                txn.now_us,
                interval_us,
                epoch,
                slot_us,
                holder,
                lease_us,
                lead_us,
                handoff_us,
            )
            txn.set_mark(task_id, retries, mark)
            return result

    def take(
        self,
        bucket: str,
        task_id: str,
        retries: int,
        interval_us: int,
        not_before_in_us: int,
        holder: str,
        lease_us: int,
        lead_us: int = 0,
        handoff_us: int = 0,
        *,
        done_first: Sequence[DoneMark] = (),
        dedupe_ttl_us: int = 0,
    ) -> tuple[Grant, Claim | None]:
        """Atomically grant, and claim at once when the slot is due (``schedule.take``);
        ``done_first`` are ``done`` marks sent ahead of it (one round trip on Redis)."""
        if done_first:
            self.done(done_first, dedupe_ttl_us)
        with self._locked(bucket) as txn:
            txn.state, mark, granted, claimed = schedule.take(
                txn.state,
                txn.mark(task_id, retries),
                txn.now_us,
                interval_us,
                not_before_in_us,
                holder,
                lease_us,
                lead_us,
                handoff_us,
            )
            txn.set_mark(task_id, retries, mark)
            return granted, claimed

    def done(self, marks: Sequence[DoneMark], dedupe_ttl_us: int) -> None:
        """Mark each message acknowledged; atomic per bucket (one lock per bucket in the batch)."""
        by_bucket: dict[str, list[DoneMark]] = {}
        for m in marks:
            by_bucket.setdefault(m.bucket, []).append(m)
        for bucket, group in by_bucket.items():
            with self._locked(bucket) as txn:
                for m in group:
                    txn.set_mark(
                        m.task_id,
                        m.retries,
                        schedule.done(txn.mark(m.task_id, m.retries), txn.now_us, dedupe_ttl_us),
                    )

    #: A file store is shared by every process; MemoryStore says otherwise.
    posts_done = True

    def prepare_post(self) -> None:  # noqa: B027 (deliberately empty, not abstract)
        """Nothing to prepare: ``post_done`` works on a local file or memory at once."""

    def post_done(self, mark: DoneMark, dedupe_ttl_us: int) -> None:
        """``done`` at once: a local file or memory does not hang as a server can."""
        self.done([mark], dedupe_ttl_us)

    def renew(self, bucket: str, task_id: str, retries: int, holder: str, lease_us: int) -> bool:
        """Atomically extend ``holder``'s live lease to now + ``lease_us``; False if none."""
        with self._locked(bucket) as txn:
            mark, renewed = schedule.renew(txn.mark(task_id, retries), txn.now_us, holder, lease_us)
            txn.set_mark(task_id, retries, mark)
            return renewed

    def pause(self, bucket: str, interval_us: int) -> Status:
        """Atomically freeze the bucket's virtual time (idempotent); returns the new status."""
        return self._update(bucket, interval_us, schedule.pause)

    def unpause(self, bucket: str, interval_us: int) -> Status:
        """Atomically resume, shifting all granted slots by the pause length (idempotent)."""
        return self._update(bucket, interval_us, schedule.unpause)

    def set_interval(self, bucket: str, interval_us: int, new_interval_us: int) -> Status:
        """Atomically override the bucket's interval with ``new_interval_us``."""
        return self._update(
            bucket,
            interval_us,
            lambda s, now_us, i_us: schedule.set_interval(s, now_us, i_us, new_interval_us),
        )

    def reset(self, bucket: str) -> None:
        """Atomically forget the bucket's state (marks are kept: dedupe survives a reset)."""
        with self._locked(bucket) as txn:
            txn.state = None

    def status(self, bucket: str, interval_us: int) -> Status:
        """Read the bucket's state without changing it."""
        with self._locked(bucket, write=False) as txn:
            return schedule.status(txn.state, txn.now_us, interval_us)

    def _update(
        self,
        bucket: str,
        interval_us: int,
        step: Callable[[BucketState | None, int, int], BucketState],
    ) -> Status:
        with self._locked(bucket) as txn:
            txn.state = step(txn.state, txn.now_us, interval_us)
            return schedule.status(txn.state, txn.now_us, interval_us)
