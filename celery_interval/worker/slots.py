"""The slot cycle: a held task's ticket, its claim at the slot, and its start in the pool."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_interval.config import Settings
from celery_interval.errors import StoreError
from celery_interval.headers import (
    CLAIM_HEADER,
    CLAIMED_HEADER,
    CLOCK_HEADER,
    MARK_HEADER,
    SPIN_HEADER,
    START_HEADER,
    STORE_START_HEADER,
)
from celery_interval.schedule import Claim, Grant, Outcome, Pace
from celery_interval.stores.base import DoneBatch, Store, TaskCopy
from celery_interval.worker.acks import DROPPED_KEY
from celery_interval.worker.clock import StoreClock
from celery_interval.worker.held import Held, HeldState
from celery_interval.worker.holding import Holding
from celery_interval.worker.notify import Notify
from celery_interval.worker.pause import PausedTasks
from celery_interval.worker.pool import POOL_POLL_S, Pool
from celery_interval.worker.process.started import lead_for, spin_ns_for
from celery_interval.worker.store.births import Births
from celery_interval.worker.store.done import DoneMarks
from celery_interval.worker.store.leases import Leases
from celery_interval.worker.store.outage import StoreOutage
from celery_interval.worker.store.places import RunningPlaces
from celery_interval.worker.tickets import Tickets
from celery_interval.worker.timer import cancel

__all__ = ["SlotCycle", "SlotParts"]

logger = logging.getLogger("celery_interval.worker")

#: A copy whose task runs under another holder's lease looks again at most this late.
HELD_RECHECK_S = 1.0


@dataclass(frozen=True)
class SlotParts:
    """What the slot cycle works with, made by its service: the store and the worker's records."""

    settings: Settings
    store: Store
    timer: Any
    holding: Holding
    done: DoneMarks
    leases: Leases
    outage: StoreOutage
    places: RunningPlaces
    notify: Notify


class SlotCycle:
    """Takes each held task through its ticket (a grant), its claim at the slot and its start
    in the pool, with the outcomes between: a wait, a pause, another holder's lease, a new
    ticket, a duplicate dropped. It owns the tickets, the pool's queue, the store clock and
    the tasks waiting out a pause."""

    def __init__(self, parts: SlotParts, pool_slots: Callable[[], int]) -> None:
        self.settings, self.store, self.timer = parts.settings, parts.store, parts.timer
        self.holding, self.done, self.leases = parts.holding, parts.done, parts.leases
        self.outage, self.places, self.notify = parts.outage, parts.places, parts.notify
        #: Tasks whose claim found their bucket paused, claimed again as it resumes.
        self.paused = PausedTasks(self.settings, self.store, self.timer, self.outage, due=self.due)
        self.clock = StoreClock()
        self.births = Births(self.done, self.store, self.timer)
        self._epochs: dict[str, int] = {}
        #: Tasks whose claim found their capped bucket FULL, by bucket: the first claims again
        #: at once when a body of the bucket ends here.
        self._full: dict[str, set[Held]] = {}
        self.pool = Pool(self.timer, pool_slots, claim=self._claim)
        self.tickets = Tickets(self.timer, self.pool, grant=self.grant, forget=self._forget)

    def admit(self, held: Held) -> None:
        """Queue a newly held task for a ticket (an ETA or countdown task once it is due)."""
        eligible_in_us = held.not_before_in_us - self.settings.lead_us
        if eligible_in_us > 0:
            held.state = HeldState.ETA
            self._arm(held, eligible_in_us / 1e6, self.tickets.enqueue)
        else:
            self.tickets.enqueue(held, at_head=held.resent)

    def pool_freed(self) -> None:
        """A pool process finished a task (on the loop's thread): fill soon."""
        self.pool.freed()
        self.tickets.fill_soon()

    def place_freed(self, bucket: str) -> None:
        """A body of capped ``bucket`` ended here and released its place: the lowest ticket
        waiting for a place claims now, not at its next look."""
        waiting = [h for h in self._full.pop(bucket, ()) if h.entry is not None]
        if waiting:
            first = min(waiting, key=lambda h: h.ticket)
            cancel(self.timer, first.entry)
            first.entry = None
            self._full[bucket] = set(waiting) - {first}
            self.due(first)

    def grant(self, held: Held) -> None:
        """Take a ticket; with a pool process free, claim it in the same trip if it is due."""
        held.state = HeldState.GRANTING
        held_us = (time.monotonic_ns() - held.received_ns) // 1000
        not_before_in_us = max(0, held.not_before_in_us - held_us)
        copy = held.copy
        claimed: Claim | None = None
        marks: list[TaskCopy] = []
        op = "grant"
        pace = Pace(held.interval_us, not_before_in_us, held.burst, held.cost, limits=held.limits)
        sent_ns = time.monotonic_ns()
        try:
            if (
                self.pool.free() > 0
                and not self.pool.waiting
                and not self.tickets.armed(held)  # an earlier ticket claims first
                and not held.request.revoked()
                and not self.began_here(held)  # no start for a copy of what ran here
            ):
                op = "take"
                marks = self.done.take()
                lead_us, handoff_us = self._reach_us()
                terms = held.claim_args(handoff_us).terms(
                    self.settings.lease_us, lead_us, self.births.latest_us
                )
                grant, claimed = self.store.take(
                    copy, pace, terms, done_first=DoneBatch(marks, self.settings.dedupe_ttl_us)
                )
            else:
                grant = self.store.grant(copy, pace)
        except StoreError as exc:
            self.done.put_back(marks)
            self.outage.failed(exc)
            self._arm(held, self.outage.backoff_s, self.grant)
            return
        except Exception:
            self.done.put_back(marks)  # the marks go with the next flush
            raise
        received_ns = time.monotonic_ns()
        self.outage.answered()
        store = (op, (received_ns - sent_ns) / 1e9)
        self._on_grant(held, grant, store, arm=claimed is None)
        if claimed is not None:
            self.clock.observe(claimed.now_us, sent_ns, received_ns)
            self._on_claim(held, claimed, (sent_ns, received_ns), None)

    def _on_grant(
        self, held: Held, grant: Grant, store: tuple[str, float], *, arm: bool = True
    ) -> None:
        stats = self.holding.stats[held.bucket]
        if grant.outcome is Outcome.DUPLICATE:
            self.drop_duplicate(held, "already done")
            return
        if grant.outcome is Outcome.OK and self.began_here(held):  # the store lost its mark?
            self.done.again_if_ended(held.copy)  # not a throttled or running body's
            self.drop_duplicate(held, "already began here")
            return
        if grant.outcome is Outcome.HELD:
            self._wait_for_lease(held, grant.delay_us, self._requeue)
            return
        stats.grants += 1
        stats.interval_us = held.interval_us
        stats.burst = held.burst
        stats.limits = held.limits
        stats.last_paused = grant.paused
        held.granted(grant.epoch, grant.ticket, grant.slot_us, time.time() + grant.delay_us / 1e6)
        self.holding.due_at(held.bucket, time.monotonic_ns() + grant.delay_us * 1000)
        self.notify.granted(held, grant.delay_us / 1e6, store)
        logger.info(
            "interval %s: task %s ticket %d slot in %.3fs%s (held here: %d)",
            held.bucket,
            held.request.id,
            grant.ticket,
            grant.delay_us / 1e6,
            " (paused)" if grant.paused else "",
            len(self.holding.held[held.bucket]),
        )
        if arm:
            self._arm(held, max(0, grant.delay_us - self._reach_us()[0]) / 1e6, self.due)

    def due(self, held: Held) -> None:
        """``held``'s slot is near: claim it, or wait for a pool process first."""
        held.entry = None
        self._full.get(held.bucket, set()).discard(held)
        if self.pool.free() <= 0 or self.pool.waiting:
            self.pool.wait(held)
            return
        self._claim(held)

    def _claim(self, held: Held) -> None:
        if held.request.revoked():
            self._hand_over(held)
            return
        if self.began_here(held):  # its task began here after this copy's grant
            self.drop_duplicate(held, "already began here")
            return
        earlier = self.tickets.armed_before(held)
        if earlier is not None:  # it claims first; this one looks again just after
            after_s = max(0, earlier.due_ns - time.monotonic_ns()) / 1e9 + POOL_POLL_S
            self._arm(held, after_s, self.due)
            return
        lead_us, handoff_us = self._reach_us()
        lease_us, knew_us = self.settings.lease_us, self.births.latest_us
        sent_ns = time.monotonic_ns()
        try:
            claim_args = held.claim_args(handoff_us)
            result = claim_args.claim(self.store, lease_us, lead_us, knew_born_us=knew_us)
        except StoreError as exc:
            self.outage.failed(exc)
            self._arm(held, self.outage.backoff_s, self.due)
            return
        received_ns = time.monotonic_ns()
        self.clock.observe(result.now_us, sent_ns, received_ns)
        self.outage.answered()
        self._on_claim(
            held, result, (sent_ns, received_ns), ("claim", (received_ns - sent_ns) / 1e9)
        )

    def _hand_over(self, held: Held) -> None:
        """A ticketed task was revoked or expired: the next one queued here takes its slot."""
        self._forget(held)
        successor = self.tickets.successor(held.bucket)
        if successor is None:
            logger.info("interval %s: task %s revoked while held", held.bucket, held.request.id)
            self.tickets.fill(held.bucket)
            return
        logger.info(
            "interval %s: task %s revoked while held, ticket %d goes to task %s",
            held.bucket,
            held.request.id,
            held.ticket,
            successor.request.id,
        )
        wall_s = held.slot_wall_s or time.time()
        successor.granted(held.epoch, held.ticket, held.slot_us, wall_s)
        self.notify.granted(successor, max(0.0, wall_s - time.time()), None)
        self._claim(successor)

    def _reach_us(self) -> tuple[int, int]:
        """(lead, handoff) of a claim: the handoff also covers the reply's way back from the
        store (half the best recent round trip), so a worker behind a slow link is admitted a
        start it can still reach; the claim comes at least that early (at most MAX_LEAD_US)."""
        handoff_us = self.settings.handoff_us + self.clock.one_way_us()
        return lead_for(self.settings.lead_us, handoff_us), handoff_us

    def _on_claim(
        self, held: Held, result: Claim, trip_ns: tuple[int, int], store: tuple[str, float] | None
    ) -> None:
        """Act on a claim's outcome; ``trip_ns``: when the call went and its reply came."""
        self.births.saw(result.born_us)
        stats = self.holding.stats[held.bucket]
        outcome = result.outcome
        stats.last_paused = outcome is Outcome.PAUSED
        late_s = None
        if outcome is Outcome.OK:
            late_s = max(0, result.now_us + result.delay_us - held.slot_us) / 1e6
        self.notify.claimed(held, outcome, late_s, store)
        sent_ns, received_ns = trip_ns
        if outcome is Outcome.OK:
            stats.claims += 1
            start_ns = self.clock.local_ns(
                result.now_us + result.delay_us, sent_ns, received_ns, result.delay_us
            )
            self._start(held, start_ns, result.now_us + result.delay_us)
        elif outcome is Outcome.WAIT:
            stats.waits += 1
            self._arm(held, max(0, result.delay_us - self._reach_us()[0]) / 1e6, self.due)
        elif outcome is Outcome.FULL:  # no lead: a place frees when it does
            stats.waits += 1
            self._full.setdefault(held.bucket, set()).add(held)
            self._arm(held, result.delay_us / 1e6, self.due)
        elif outcome is Outcome.PAUSED:
            stats.paused += 1
            self.paused.add(held)
        elif outcome is Outcome.HELD:
            self._wait_for_lease(held, result.delay_us, self.due)
        elif outcome is Outcome.RETICKET:
            stats.retickets += 1
            if result.epoch != held.epoch and self._epochs.get(held.bucket) != result.epoch:
                self._epochs[held.bucket] = result.epoch
                logger.warning(
                    "interval %s: new epoch %d (the store lost the bucket's state, or it was "
                    "reset, or it expired idle): held tasks re-ticket",
                    held.bucket,
                    result.epoch,
                )
            logger.info(
                "interval %s: task %s lost its spot (ticket %d, epoch %d -> %d), re-ticketing",
                held.bucket,
                held.request.id,
                held.ticket,
                held.epoch,
                result.epoch,
            )
            if held.ticketed:
                self.grant(held)
            else:
                self._requeue(held)
        else:
            self.drop_duplicate(held, "already done elsewhere")

    def began_here(self, held: Held) -> bool:
        """A copy of what began here (not a throttled task's copy sent again: it must run)."""
        return not held.resent and self.done.began_here(held.copy)

    def drop_duplicate(self, held: Held, why: str) -> None:
        """Ack and forget a copy of a task that ran (or runs) under another copy."""
        self.holding.stats[held.bucket].duplicates += 1
        logger.info(
            "interval %s: task %s %s, dropping duplicate copy", held.bucket, held.request.id, why
        )
        self._forget(held)
        held.request.request_dict[DROPPED_KEY] = True
        held.request.acknowledge()
        self.tickets.fill(held.bucket)

    def _wait_for_lease(self, held: Held, left_us: int, then: Callable[[Held], None]) -> None:
        """The task runs under another holder's lease: this copy gives up its place among the
        tickets (it waits for that lease, not for a process here) and looks again when the
        lease may have ended, or within ``HELD_RECHECK_S`` (a done task's copy is dropped)."""
        self.holding.stats[held.bucket].helds += 1
        held.state = HeldState.HELD_BY_OTHER
        self.tickets.unticket(held)
        self._arm(held, min(left_us / 1e6, HELD_RECHECK_S) + 0.001, then)
        self.tickets.fill(held.bucket)

    def _requeue(self, held: Held) -> None:
        """Back to the head of the bucket's queue, to take a ticket when a process is free."""
        self.tickets.enqueue(held, at_head=True)

    def _start(self, held: Held, start_ns: int, start_us: int) -> None:
        held.state = HeldState.STARTED
        held.request.request_dict[CLAIMED_HEADER] = time.monotonic_ns()
        held.request.request_dict[START_HEADER] = start_ns
        held.request.request_dict[STORE_START_HEADER] = start_us
        held.request.request_dict[CLOCK_HEADER] = self.clock.offset_ns()
        held.request.request_dict[SPIN_HEADER] = spin_ns_for(held.interval_us)
        held.request.request_dict[CLAIM_HEADER] = held.claim_args(self._reach_us()[1])
        self.pool.handed(held)
        self.births.watch()
        if held.cap is not None:
            self.places.hold(held.request, held.copy, held.cap)
        if held.acks_late:
            self.leases.hold(held.key, held.holder)
        elif self.store.posts_done:
            held.request.request_dict[MARK_HEADER] = True
        self._forget(held)
        self.notify.received(held)
        held.release(held.request)

    def _forget(self, held: Held) -> None:
        self._full.get(held.bucket, set()).discard(held)
        if held.entry is not None:
            cancel(self.timer, held.entry)
            held.entry = None
        self.tickets.unticket(held)
        if self.holding.remove(held):
            self.tickets.drop_empty(held.bucket)

    def _arm(self, held: Held, delay_s: float, callback: Callable[[Held], None]) -> None:
        held.due_ns = time.monotonic_ns() + int(delay_s * 1e9)
        held.entry = self.timer.call_after(delay_s, callback, (held,), priority=6)

    def forget_released(self) -> None:
        """Tasks released to the pool but not accepted when the channel closed: Celery drops
        them (a process may still run one already written to it) and never reports their end.
        Their leases and places lapse (a copy waits for the lease, not forever); logged by id."""
        orphans = self.pool.take_unaccepted()
        if not orphans:
            return
        for held in orphans:
            self.leases.drop(held.key)
            self.places.drop(held.request)
        self.done.look_for_marks([h.copy for h in orphans])
        logger.warning(
            "interval: connection lost with %d task(s) released to the pool but not yet accepted "
            "(%s): their copies wait for the lease (up to %.0fs) before they can run",
            len(orphans),
            ", ".join(h.request.id for h in orphans),
            self.settings.lease_us / 1e6,
        )

    def clear(self) -> None:
        """The connection is gone: nothing waits for a ticket, a place or a pool process any
        more (a place freed later must not start a task whose message went back)."""
        self.pool.clear()
        self.tickets.clear()
        self._full.clear()
