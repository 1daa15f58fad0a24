"""The store protocol: a narrow, atomic backend for bucket state and per-task marks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from celery_interval.schedule import (
    Backoff,
    Claim,
    ClaimTerms,
    Grant,
    Limits,
    Pace,
    Slot,
    Status,
    Unset,
)

__all__ = ["ClaimArgs", "DoneBatch", "Store", "TaskCopy"]


@dataclass(frozen=True, slots=True)
class TaskCopy:
    """One message's copy as the store knows it: its bucket and (task_id, retries)."""

    bucket: str
    task_id: str
    retries: int

    @property
    def place(self) -> str:
        """The name of this copy's body in its bucket's places (a capped bucket)."""
        return f"{self.task_id}:{self.retries}"


@dataclass(frozen=True, slots=True)
class DoneBatch:
    """Copies of acknowledged messages to mark done, each remembered for ``dedupe_ttl_us``."""

    copies: Sequence[TaskCopy]
    dedupe_ttl_us: int


class ClaimArgs(NamedTuple):
    """What one held message's claim names, in the order of the ``headers.CLAIM_HEADER`` list:
    the worker claims with it, and hands it to the pool process, which claims again with it
    when it reached the task after its start."""

    bucket: str
    task_id: str
    retries: int
    interval_us: int
    epoch: int
    slot_us: int
    holder: str
    ticket: int
    handoff_us: int
    #: The bucket's burst and the task's cost (units; ``schedule.burst``).
    burst: int = 1
    cost: int = 1
    #: The bucket's extra limits (``schedule.limits``).
    limits: Limits = ()
    #: The bucket's cap on running bodies (``schedule.claim_capped``; None: none).
    cap: int | None = None
    #: The message was delivered before (``ClaimTerms.redelivered``).
    redelivered: bool = False

    @property
    def copy(self) -> TaskCopy:
        """The message's copy this claim is for."""
        return TaskCopy(self.bucket, self.task_id, self.retries)

    def pace(self, not_before_in_us: int = 0) -> Pace:
        """What a grant of this message asks for."""
        return Pace(self.interval_us, not_before_in_us, self.burst, self.cost, limits=self.limits)

    def terms(self, lease_us: int, lead_us: int, knew_born_us: int | None = None) -> ClaimTerms:
        """The terms of this message's claim (under the bucket's ``cap``)."""
        return ClaimTerms(
            self.holder,
            lease_us,
            lead_us,
            self.handoff_us,
            self.cap,
            burst=self.burst,
            cost=self.cost,
            limits=self.limits,
            knew_born_us=knew_born_us,
            redelivered=self.redelivered,
        )

    def claim(
        self,
        store: Store,
        lease_us: int,
        lead_us: int,
        *,
        knew_born_us: int | None = None,
    ) -> Claim:
        """``store.claim`` of this message's slot under its holder (under the bucket's ``cap``)."""
        terms = self.terms(lease_us, lead_us, knew_born_us)
        slot = Slot(self.epoch, self.slot_us)
        return store.claim(self.copy, self.interval_us, slot, terms, ticket=self.ticket)


class Store(Protocol):
    """Every method is one atomic step on the store's clock; times are integer microseconds.

    ``interval_us`` (``pace.interval_us``) is the caller's configured interval, used unless the
    bucket carries a ``set_interval`` override. Methods raise ``StoreUnavailable`` when the
    store cannot be reached (the operation may or may not have happened: claims are idempotent
    per holder).
    """

    def grant(self, copy: TaskCopy, pace: Pace) -> Grant:
        """Atomically take a ticket and slot (``schedule.grant``); DUPLICATE if already done."""
        ...

    def claim(
        self, copy: TaskCopy, interval_us: int, slot: Slot, terms: ClaimTerms, *, ticket: int = 0
    ) -> Claim:
        """Atomically decide whether ``terms.holder``'s copy starts now (``schedule.claim``).

        ``ticket`` is the ticket the caller holds; it only goes into the ledger (RedisStore).
        """
        ...

    def take(
        self, copy: TaskCopy, pace: Pace, terms: ClaimTerms, *, done_first: DoneBatch | None = None
    ) -> tuple[Grant, Claim | None]:
        """Atomically grant, and claim at once when the slot is due (``schedule.take``);
        ``done_first`` is marked ``done`` ahead of it (one round trip on Redis)."""
        ...

    def done(self, copies: Sequence[TaskCopy], dedupe_ttl_us: int) -> None:
        """Mark each copy acknowledged for ``dedupe_ttl_us``; each atomic, batch pipelined."""
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

    def settle_post(self, timeout_s: float) -> None:
        """After the body whose mark was posted: see, within ``timeout_s``, that the marks
        posted reached the store (sent again on a new connection if a lost one took them)."""
        ...

    def post_done(self, copy: TaskCopy, dedupe_ttl_us: int) -> None:
        """As ``done`` for one copy, but never waiting on a slow or hung store: the mark is on
        its way when this returns (or, where a store cannot promise that, not sent at all)."""
        ...

    def renew(self, bucket: str, task_id: str, retries: int, holder: str, lease_us: int) -> bool:
        """Atomically extend ``holder``'s live lease to now + ``lease_us``; False if none."""
        ...

    def release(self, copy: TaskCopy) -> bool:
        """Atomically free the place of ``copy``'s body in its capped bucket
        (``schedule.release``); False if it held no live one."""
        ...

    def renew_place(self, copy: TaskCopy, place_us: int, cap: int | None = None) -> bool:
        """Atomically extend the live place of ``copy``'s body to now + ``place_us``, or take
        it again while fewer than ``cap`` are live (``schedule.renew_place``); False if it
        holds none and cannot."""
        ...

    def throttle(self, copy: TaskCopy, interval_us: int, backoff: Backoff) -> Status:
        """Atomically defer every start of the bucket by ``backoff.retry_after_us`` from now
        and keep the first slot after it for ``copy`` (``schedule.throttle``); an adaptive
        bucket (``backoff.adapt_max_us``) slows first."""
        ...

    def pause(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Status:
        """Atomically freeze the bucket's virtual time (idempotent); returns the new status.

        This and the other control operations return the status as ``status`` with ``pace``
        reads it right after the change, in the same atomic step."""
        ...

    def unpause(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Status:
        """Atomically resume, shifting all granted slots by the pause length (idempotent)."""
        ...

    def set_interval(
        self, bucket: str, interval_us: int, new_interval_us: int, pace: Pace | None = None
    ) -> Status:
        """Atomically override the bucket's interval with ``new_interval_us`` (``pace`` carries
        the configured one; the status reads the new one)."""
        ...

    def unset_interval(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Unset:
        """Atomically drop the bucket's override (``schedule.unset_interval``): its configured
        ``interval_us`` is back; a bucket with none is left as it is (``dropped`` is False)."""
        ...

    def reset(self, bucket: str) -> None:
        """Atomically forget the bucket's state: the next operation starts a new epoch."""
        ...

    def status(self, bucket: str, interval_us: int, pace: Pace | None = None) -> Status:
        """Read the bucket's state without changing it; with the bucket's ``pace`` (its burst
        and extra limits), the next slot is the one a ticket would get now and ``units_left``
        each budget's units (``schedule.status``)."""
        ...

    def born_us(self) -> int | None:
        """The store's birth marker (its clock, µs) as it stands, written by nothing: None
        before a state-making call wrote it, or on a store that keeps none (a Cluster)."""
        ...

    def ping(self) -> None:
        """Raise ``StoreUnavailable`` unless the store answers; a store may get ready for its
        calls here (connect, load its scripts), so that no early call's round trip carries
        that work."""
        ...

    def close(self) -> None:
        """Release connections and file handles."""
        ...
