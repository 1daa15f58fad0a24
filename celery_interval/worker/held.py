"""One received message held on a worker until its slot, and the states it passes through."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery_interval.headers import TICKET_HEADER
from celery_interval.schedule import Limits
from celery_interval.stores.base import ClaimArgs, TaskCopy

__all__ = ["Held", "HeldState"]


class HeldState(enum.Enum):
    """Where a held message is; the value is what ``inspect interval_stats`` shows."""

    NEW = "new"
    #: An ETA or countdown task, not yet due for a ticket.
    ETA = "eta"
    #: Waiting in its bucket's queue for a ticket.
    QUEUED = "queued"
    GRANTING = "granting"
    GRANTED = "granted"
    #: Due, waiting for a free pool process.
    WAITING_POOL = "waiting-pool"
    PAUSED = "paused"
    #: Its task runs under another holder's lease.
    HELD_BY_OTHER = "held-by-other"
    STARTED = "started"


@dataclass(eq=False)
class Held:
    """One received message waiting for its slot on this worker."""

    request: Any
    bucket: str
    #: The message's id in the store: the task id, marked when Celery replaced the task.
    task_id: str
    retries: int
    queue: str | None
    interval_us: int
    not_before_in_us: int
    holder: str
    acks_late: bool
    release: Callable[[Any], None]
    #: The most bodies of its bucket running at once (None: no cap).
    cap: int | None = None
    #: Its bucket's burst and its own cost (units of one interval's budget).
    burst: int = 1
    cost: int = 1
    #: Its bucket's extra limits (its declaration's ``limits``).
    limits: Limits = ()
    #: Start order among the messages waiting here: lower first (the broker's priority).
    rank: int = 0
    epoch: int = 0
    ticket: int = 0
    slot_us: int = 0
    #: The slot on this worker's wall clock (Unix seconds), once granted.
    slot_wall_s: float | None = None
    entry: Any = None
    #: When ``entry`` fires (monotonic ns).
    due_ns: int = 0
    state: HeldState = HeldState.NEW
    ticketed: bool = False
    #: Taken back from its bucket's overflow queue: its turn, never parked again.
    unparked: bool = False
    #: A throttled task sent again: first for a ticket (its kept slot), never parked.
    resent: bool = False
    #: ``task-received`` went out for this delivery.
    announced: bool = False
    received_ns: int = field(default_factory=time.monotonic_ns)

    @property
    def redelivered(self) -> bool:
        """The broker hands this copy out again (not a throttled task's copy sent again: that
        runs): a body of it may have run."""
        info = getattr(self.request, "delivery_info", None) or {}
        return bool(info.get("redelivered")) and not self.resent

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.bucket, self.task_id, self.retries)

    def granted(self, epoch: int, ticket: int, slot_us: int, slot_wall_s: float) -> None:
        """This message holds ``ticket`` at ``slot_us`` of ``epoch`` (its own grant, or the
        ticket of a revoked message handed over to it), due at ``slot_wall_s`` here."""
        self.epoch, self.ticket, self.slot_us = epoch, ticket, slot_us
        self.slot_wall_s = slot_wall_s
        self.request.request_dict[TICKET_HEADER] = ticket
        self.state = HeldState.GRANTED

    @property
    def copy(self) -> TaskCopy:
        """This message's copy as the store knows it."""
        return TaskCopy(self.bucket, self.task_id, self.retries)

    def claim_args(self, handoff_us: int) -> ClaimArgs:
        return ClaimArgs(
            self.bucket,
            self.task_id,
            self.retries,
            self.interval_us,
            self.epoch,
            self.slot_us,
            self.holder,
            self.ticket,
            handoff_us,
            self.burst,
            self.cost,
            self.limits,
            self.cap,
            self.redelivered,
        )
