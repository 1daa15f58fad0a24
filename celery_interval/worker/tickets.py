"""Tickets: held tasks queue by bucket, and take one ticket each while a pool process is free."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from typing import Any

from celery_interval.worker.held import Held, HeldState
from celery_interval.worker.pool import POOL_POLL_S, Pool
from celery_interval.worker.timer import cancel

__all__ = ["Tickets"]

#: With the pool full of this worker's interval tasks, a queued task still looks for a free
#: process this often (their ends trigger a look; this covers a lost trigger).
STARVED_POLL_S = 0.05


class Tickets:
    """Each bucket's tasks waiting for a ticket, in order, and the unstarted tickets each
    bucket holds here; ``grant`` takes a ticket from the store."""

    def __init__(
        self,
        timer: Any,
        pool: Pool,
        grant: Callable[[Held], None],
        forget: Callable[[Held], None],
    ) -> None:
        self.timer = timer
        self.pool = pool
        self._grant = grant
        self._forget = forget
        self.queued: dict[str, deque[Held]] = defaultdict(deque)
        #: Each bucket's tasks holding a ticket here that did not start yet.
        self.ticketed: dict[str, set[Held]] = {}
        self._filling = False
        self._fill_entry: Any = None
        self._starved_entry: Any = None

    def enqueue(self, held: Held, *, at_head: bool = False) -> None:
        """Queue ``held`` for a ticket: behind the tasks of its rank (or at the head), then fill."""
        held.entry = None
        held.state = HeldState.QUEUED
        queued = self.queued[held.bucket]
        if at_head:
            queued.appendleft(held)
        else:
            at = len(queued)
            while at and queued[at - 1].rank > held.rank:
                at -= 1
            queued.insert(at, held)
        self.fill(held.bucket)

    def fill(self, bucket: str) -> None:
        """Take tickets, oldest message first, while this bucket holds fewer unstarted tickets
        here than the pool has free processes: a ticket held with no process to start it is
        passed by other workers' later tickets and must re-ticket to the tail. None while due
        tasks wait for a process (the pool is saturated: they are taken as processes free)."""
        queued = self.queued.get(bucket)
        if self._filling or not queued:
            return
        self._filling = True
        took = False
        pool = self.pool
        try:
            while (
                queued
                and not pool.waiting
                and (
                    self.count(bucket) < pool.free() or queued[0].resent  # its slot is kept
                )
            ):
                held = queued.popleft()
                if held.request.revoked():  # revoked or expired: no ticket, no slot
                    self._forget(held)
                    continue
                self._ticket(held)
                took = True
                self._grant(held)
        finally:
            self._filling = False
        if took and queued and self.queued.get(bucket) is queued:
            self.queued[bucket] = self.queued.pop(bucket)  # to the end: buckets take turns
        if queued and not self.count(bucket):
            # No process is free: ours finishing calls fill_soon; other tasks need a look.
            self._ensure_starved_poll(POOL_POLL_S if pool.in_pool <= 0 else STARVED_POLL_S)

    def fill_soon(self) -> None:
        """A pool process freed: fill every bucket on the loop's next turn."""
        if self._fill_entry is None:
            self._fill_entry = self.timer.call_after(0.0, self._fill_all, priority=6)

    def _ensure_starved_poll(self, delay_s: float) -> None:
        if self._starved_entry is None:
            self._starved_entry = self.timer.call_after(delay_s, self._starved_poll, priority=6)

    def _starved_poll(self) -> None:
        self._starved_entry = None
        self._fill_all()

    def _fill_all(self) -> None:
        self._fill_entry = None
        for bucket in [b for b, q in self.queued.items() if q]:
            if self.pool.waiting:
                self._ensure_starved_poll(STARVED_POLL_S)
                return
            self.fill(bucket)

    def successor(self, bucket: str) -> Held | None:
        """The next live task queued for ``bucket``, ticketed to take over a revoked task's
        ticket (revoked ones on the way are let go); None if there is none."""
        queued = self.queued.get(bucket)
        while queued:
            held = queued.popleft()
            if held.request.revoked():
                self._forget(held)
                continue
            self._ticket(held)
            return held
        return None

    def unticket(self, held: Held) -> None:
        """``held`` no longer counts among its bucket's unstarted tickets."""
        if held.ticketed:
            held.ticketed = False
            tickets = self.ticketed[held.bucket]
            tickets.discard(held)
            if not tickets:
                del self.ticketed[held.bucket]

    def count(self, bucket: str) -> int:
        """How many unstarted tickets ``bucket`` holds here."""
        return len(self.ticketed.get(bucket, ()))

    def armed_before(self, held: Held) -> Held | None:
        """The lowest ticket of ``held``'s bucket and epoch held here below ``held``'s whose
        claim waits for its time (None if there is none). Claims go out in ticket order, or
        this worker would pass its own ticket: when a start admitted again pushed the bucket's
        starts past their slots, neighbouring tickets wait for the same start."""
        earlier = [
            other
            for other in self._armed(held)
            if other.epoch == held.epoch and other.ticket < held.ticket
        ]
        return min(earlier, key=lambda other: other.ticket, default=None)

    def armed(self, held: Held) -> bool:
        """Whether another ticket of ``held``'s bucket held here waits for its claim's time."""
        return any(True for _ in self._armed(held))

    def _armed(self, held: Held) -> Iterator[Held]:
        for other in self.ticketed.get(held.bucket, ()):
            if other is not held and other.state is HeldState.GRANTED and other.entry is not None:
                yield other

    def _ticket(self, held: Held) -> None:
        held.ticketed = True
        self.ticketed.setdefault(held.bucket, set()).add(held)

    def drop_empty(self, bucket: str) -> None:
        """``bucket`` holds nothing here: drop its queue (many tenants come and go)."""
        if bucket in self.queued and not self.queued[bucket]:
            del self.queued[bucket]

    def clear(self) -> None:
        """The connection is gone: nothing waits for a ticket any more."""
        for entry in (self._fill_entry, self._starved_entry):
            if entry is not None:
                cancel(self.timer, entry)
        self._fill_entry = self._starved_entry = None
        self.queued.clear()
        self.ticketed.clear()
