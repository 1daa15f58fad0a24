"""The store protocol: a narrow, atomic backend for bucket state and per-task marks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from celery_interval.schedule import Claim, Grant, Status

__all__ = ["ClaimArgs", "DoneMark", "Store"]


@dataclass(frozen=True)
class DoneMark:
    """One acknowledged message: (bucket, task_id, retries)."""

    bucket: str
    task_id: str
    retries: int


class ClaimArgs(NamedTuple):
    """What one held message's claim names: the worker claims with it, and hands it to the pool
    process, which claims again with it when it reached the task after its start."""

    bucket: str
    task_id: str
    retries: int
    interval_us: int
    epoch: int
    slot_us: int
    holder: str
    ticket: int
    handoff_us: int

    def claim(self, store: Store, lease_us: int, lead_us: int) -> Claim:
        """``store.claim`` of this message's slot under its holder."""
        return store.claim(
            self.bucket,
            self.task_id,
            self.retries,
            self.interval_us,
            self.epoch,
            self.slot_us,
            self.holder,
            lease_us,
            lead_us,
            ticket=self.ticket,
            handoff_us=self.handoff_us,
        )


class Store(Protocol):
    """Every method is one atomic step on the store's clock; times are integer microseconds.

    ``interval_us`` is the caller's configured interval, used unless the bucket carries a
    ``set_interval`` override. Methods raise ``StoreUnavailable`` when the store cannot be
    reached (the operation may or may not have happened: claims are idempotent per holder).
    """

    def grant(
        self,
        bucket: str,
        task_id: str,
        retries: int,
        interval_us: int,
        not_before_in_us: int = 0,
    ) -> Grant:
        """Atomically take a ticket and slot (``schedule.grant``); DUPLICATE if already done."""
        ...

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

        ``ticket`` is the ticket the caller holds; it only goes into the ledger (RedisStore).
        """
        ...

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
        ...

    def done(self, marks: Sequence[DoneMark], dedupe_ttl_us: int) -> None:
        """Mark each message acknowledged for ``dedupe_ttl_us``; each atomic, batch pipelined."""
        ...

    @property
    def posts_done(self) -> bool:
        """Whether ``post_done`` from a pool process reaches the store the worker uses (not a
        Cluster, not one process's memory): the worker then leaves ordinary tasks' marks to it."""
        ...

    def prepare_post(self) -> None:
        """Get ready for ``post_done`` (connect, read what earlier posts were answered); may
        block, so call it before a start's wait."""
        ...

    def post_done(self, mark: DoneMark, dedupe_ttl_us: int) -> None:
        """As ``done`` for one mark, but never waiting on a slow or hung store: the mark is on
        its way when this returns (or, where a store cannot promise that, not sent at all)."""
        ...

    def renew(self, bucket: str, task_id: str, retries: int, holder: str, lease_us: int) -> bool:
        """Atomically extend ``holder``'s live lease to now + ``lease_us``; False if none."""
        ...

    def pause(self, bucket: str, interval_us: int) -> Status:
        """Atomically freeze the bucket's virtual time (idempotent); returns the new status."""
        ...

    def unpause(self, bucket: str, interval_us: int) -> Status:
        """Atomically resume, shifting all granted slots by the pause length (idempotent)."""
        ...

    def set_interval(self, bucket: str, interval_us: int, new_interval_us: int) -> Status:
        """Atomically override the bucket's interval with ``new_interval_us``."""
        ...

    def reset(self, bucket: str) -> None:
        """Atomically forget the bucket's state: the next operation starts a new epoch."""
        ...

    def status(self, bucket: str, interval_us: int) -> Status:
        """Read the bucket's state without changing it."""
        ...

    def ping(self) -> None:
        """Raise ``StoreUnavailable`` unless the store answers."""
        ...

    def close(self) -> None:
        """Release connections and file handles."""
        ...
