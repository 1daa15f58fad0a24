"""IntervalService: a worker's held tasks, their timers, claims, dedupe marks and pause list."""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from celery_interval.config import Settings
from celery_interval.errors import StoreUnavailable
from celery_interval.headers import (
    CLAIM_HEADER,
    CLAIMED_HEADER,
    MARK_HEADER,
    SPIN_HEADER,
    START_HEADER,
    TICKET_HEADER,
)
from celery_interval.schedule import Claim, ClaimTerms, Grant, Outcome, Pace
from celery_interval.stores.base import ClaimArgs, DoneBatch, Store, TaskCopy
from celery_interval.stores.overflow import OverflowIndex
from celery_interval.worker.clock import StoreClock
from celery_interval.worker.overflow import Overflow
from celery_interval.worker.started import lead_for, spin_ns_for

__all__ = ["Held", "IntervalService"]

logger = logging.getLogger("celery_interval.worker")

#: How often a due task re-checks for a free pool process (seconds).
POOL_POLL_S = 0.001
#: With the pool full of this worker's interval tasks, a queued task still looks for a free
#: process this often (their ends trigger a look; this covers a lost trigger).
STARVED_POLL_S = 0.05
#: A copy whose task runs under another holder's lease looks again at most this late (a done
#: task's copy is dropped then, an expired lease's copy takes its turn).
HELD_RECHECK_S = 1.0
#: Done marks go on the event loop's next turn (a take in this one carries them): a worker
#: killed before its marks reach the store leaves copies that run again once the lease ends.
DONE_FLUSH_S = 0.0
#: Counters are kept for at most this many buckets that hold nothing here.
MAX_STATS = 10_000


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
    #: Start order among the messages waiting here: lower first (the broker's priority).
    rank: int = 0
    epoch: int = 0
    ticket: int = 0
    slot_us: int = 0
    entry: Any = None
    state: str = "new"
    ticketed: bool = False
    #: Taken back from its bucket's overflow queue: its turn, never parked again.
    unparked: bool = False
    received_ns: int = field(default_factory=time.monotonic_ns)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.bucket, self.task_id, self.retries)

    def granted(self, epoch: int, ticket: int, slot_us: int) -> None:
        """This message holds ``ticket`` at ``slot_us`` of ``epoch`` (its own grant, or the
        ticket of a revoked message handed over to it)."""
        self.epoch, self.ticket, self.slot_us = epoch, ticket, slot_us
        self.request.request_dict[TICKET_HEADER] = ticket
        self.state = "granted"

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
        )


@dataclass
class BucketStats:
    """Counters of one bucket on this worker, reported by ``inspect interval_stats``."""

    grants: int = 0
    claims: int = 0
    waits: int = 0
    paused: int = 0
    helds: int = 0
    retickets: int = 0
    duplicates: int = 0
    interval_us: int = 0
    last_paused: bool = False


@dataclass
class FlowControl:
    """Queues this worker stopped consuming: a bucket held too many tasks or too far ahead."""

    stopped: set[str] = field(default_factory=set)
    latest_due_ns: dict[str, int] = field(default_factory=dict)


class IntervalService:
    """Plain object behind the bootstep: no I/O of its own beyond the store and the timer."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        timer: Any,
        hostname: str,
        pool_slots: Callable[[], int],
        stop_queue: Callable[[str], None],
        resume_queue: Callable[[str], None],
        qos: Callable[[], Any],
        overflow_index: OverflowIndex | None = None,
        call_soon: Callable[..., Any] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.timer = timer
        self.hostname = hostname
        self._pool_slots = pool_slots
        self._stop_queue = stop_queue
        self._resume_queue = resume_queue
        self._qos = qos
        self.held: dict[str, list[Held]] = defaultdict(list)
        self.paused: dict[str, list[Held]] = defaultdict(list)
        self.stats: dict[str, BucketStats] = defaultdict(BucketStats)
        self.flow = FlowControl()
        self._done_pending: list[TaskCopy] = []
        self._done_entry: Any = None
        self._leases: dict[tuple[str, str, int], str] = {}
        self._renew_entry: Any = None
        self._pause_polls: dict[str, Any] = {}
        #: Due tasks waiting for a pool process: a heap by (ticket, bucket, arrival).
        self._pool_waiting: list[tuple[int, str, int, Held]] = []
        self._waiting_seq = itertools.count()
        self._pool_poll: Any = None
        self._queued: dict[str, deque[Held]] = defaultdict(deque)
        self._ticketed: Counter[str] = Counter()
        self._filling = False
        self._fill_entry: Any = None
        self._in_pool = 0
        self._released: dict[str, Held] = {}
        self._starved_entry: Any = None
        self._outage_since: float | None = None
        self.clock = StoreClock()
        self._epochs: dict[str, int] = {}
        self._backoff_s = 0.05
        self._held_n = 0
        self._call_soon = call_soon
        self._loop_thread = threading.get_ident()
        self.overflow: Overflow | None = None
        if overflow_index is not None and settings.overflow:
            self.overflow = Overflow(
                settings,
                overflow_index,
                timer,
                held_count=lambda bucket: len(self.held.get(bucket, ())),
                held_total=lambda: self._held_n,
                hold=self.receive,
                qos=qos,
            )

    # -- receipt ---------------------------------------------------------------------------

    def receive(self, held: Held) -> None:
        """Take a new message: raise prefetch for it, queue it for a ticket (an ETA or countdown
        task once it is due), apply the hold caps; or park it, when this worker cannot hold it."""
        if self.overflow is not None and self.overflow.parks(held):
            return
        self.held[held.bucket].append(held)
        self._held_n += 1
        self._qos().increment_eventually()
        eligible_in_us = held.not_before_in_us - self.settings.lead_us
        if eligible_in_us > 0:
            held.state = "eta"
            self._arm(held, eligible_in_us / 1e6, self._enqueue)
        else:
            self._enqueue(held)
        self._apply_caps(held.queue)

    def from_pool(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on the event loop's thread: at once there, else on the loop's next turn (a
        threads pool reports ends and acks from its own threads; the timer is not thread-safe).
        """
        if self._call_soon is None or threading.get_ident() == self._loop_thread:
            fn(*args)
        else:
            self._call_soon(fn, *args)

    def pool_freed(self) -> None:
        """A pool process finished a task (on the loop's thread: see ``from_pool``): fill soon."""
        self._in_pool -= 1
        if self._fill_entry is None:
            self._fill_entry = self.timer.call_after(0.0, self._fill_all, priority=6)

    def pool_accepted(self, task_id: str) -> None:
        """A pool process accepted the task: it runs (its end calls ``pool_freed``)."""
        self._released.pop(task_id, None)

    def new_holder(self) -> str:
        """A holder id unique to one delivery: ``<worker>/<48 random bits as 12 hex digits>``
        (the audit reads the worker from it)."""
        return f"{self.hostname}/{os.urandom(6).hex()}"

    # -- tickets: one per free pool process -----------------------------------------------

    def _enqueue(self, held: Held, *, front: bool = False) -> None:
        held.entry = None
        held.state = "queued"
        queued = self._queued[held.bucket]
        if front:
            queued.appendleft(held)
        else:
            at = len(queued)
            while at and queued[at - 1].rank > held.rank:
                at -= 1
            queued.insert(at, held)
        self._fill(held.bucket)

    def _fill(self, bucket: str) -> None:
        """Take tickets, oldest message first, while this bucket holds fewer unstarted tickets
        here than the pool has free processes: a ticket held with no process to start it is
        passed by other workers' later tickets and must re-ticket to the tail. None while due
        tasks wait for a process (the pool is saturated: they are taken as processes free)."""
        queued = self._queued.get(bucket)
        if self._filling or not queued:
            return
        self._filling = True
        took = False
        try:
            while queued and not self._pool_waiting and self._ticketed[bucket] < self._pool_slots():
                held = queued.popleft()
                if held.request.revoked():  # revoked or expired: no ticket, no slot
                    self._forget(held)
                    continue
                held.ticketed = True
                self._ticketed[bucket] += 1
                took = True
                self._grant(held)
        finally:
            self._filling = False
        if took and queued and self._queued.get(bucket) is queued:
            self._queued[bucket] = self._queued.pop(bucket)  # to the end: buckets take turns
        if queued and not self._ticketed[bucket]:
            # No process is free: ours finishing calls pool_freed; other tasks need a look.
            self._ensure_starved_poll(POOL_POLL_S if self._in_pool <= 0 else STARVED_POLL_S)

    def _ensure_starved_poll(self, delay_s: float) -> None:
        if self._starved_entry is None:
            self._starved_entry = self.timer.call_after(delay_s, self._starved_poll, priority=6)

    def _starved_poll(self) -> None:
        self._starved_entry = None
        self._fill_all()

    def _fill_all(self) -> None:
        self._fill_entry = None
        for bucket in [b for b, q in self._queued.items() if q]:
            if self._pool_waiting:
                self._ensure_starved_poll(STARVED_POLL_S)
                return
            self._fill(bucket)

    # -- the slot cycle --------------------------------------------------------------------

    def _grant(self, held: Held) -> None:
        """Take a ticket; with a pool process free, claim it in the same trip if it is due."""
        held.state = "granting"
        not_before_in_us = max(
            0, held.not_before_in_us - (time.monotonic_ns() - held.received_ns) // 1000
        )
        claimed: Claim | None = None
        marks: list[TaskCopy] = []
        sent_ns = time.monotonic_ns()
        try:
            if self._pool_slots() > 0 and not self._pool_waiting and not held.request.revoked():
                marks, self._done_pending = self._done_pending, []
                grant, claimed = self.store.take(
                    TaskCopy(held.bucket, held.task_id, held.retries),
                    Pace(held.interval_us, not_before_in_us),
                    ClaimTerms(held.holder, self.settings.lease_us, *self._reach_us()),
                    done_first=DoneBatch(marks, self.settings.dedupe_ttl_us),
                )
            else:
                grant = self.store.grant(
                    TaskCopy(held.bucket, held.task_id, held.retries),
                    Pace(held.interval_us, not_before_in_us),
                )
        except StoreUnavailable as exc:
            self._done_pending = marks + self._done_pending
            self.on_outage(exc)
            self._arm(held, self._backoff_s, self._grant)
            return
        except Exception:
            self._done_pending = marks + self._done_pending  # the marks go with the next flush
            raise
        received_ns = time.monotonic_ns()
        self._on_store_ok()
        self._on_grant(held, grant, claimed is None)
        if claimed is not None:
            self.clock.observe(claimed.now_us, sent_ns, received_ns)
            self._on_claim(held, claimed, sent_ns, received_ns)

    def _on_grant(self, held: Held, grant: Grant, arm: bool = True) -> None:
        stats = self.stats[held.bucket]
        if grant.outcome is Outcome.DUPLICATE:
            stats.duplicates += 1
            logger.info(
                "interval %s: task %s already done, dropping duplicate copy",
                held.bucket,
                held.request.id,
            )
            self._drop(held, ack=True)
            return
        if grant.outcome is Outcome.HELD:
            self._wait_for_lease(held, grant.delay_us, self._requeue)
            return
        stats.grants += 1
        stats.interval_us = held.interval_us
        stats.last_paused = grant.paused
        held.granted(grant.epoch, grant.ticket, grant.slot_us)
        due_ns = time.monotonic_ns() + grant.delay_us * 1000
        self.flow.latest_due_ns[held.bucket] = max(
            due_ns, self.flow.latest_due_ns.get(held.bucket, 0)
        )
        logger.info(
            "interval %s: task %s ticket %d slot in %.3fs%s (held here: %d)",
            held.bucket,
            held.request.id,
            grant.ticket,
            grant.delay_us / 1e6,
            " (paused)" if grant.paused else "",
            len(self.held[held.bucket]),
        )
        if arm:
            self._arm(held, max(0, grant.delay_us - self._reach_us()[0]) / 1e6, self._due)

    def _due(self, held: Held) -> None:
        held.entry = None
        if self._pool_slots() <= 0 or self._pool_waiting:
            self._wait_for_pool(held)
            return
        self._claim(held)

    def _claim(self, held: Held) -> None:
        if held.request.revoked():
            self._hand_over(held)
            return
        lead_us, handoff_us = self._reach_us()
        sent_ns = time.monotonic_ns()
        try:
            result = held.claim_args(handoff_us).claim(self.store, self.settings.lease_us, lead_us)
        except StoreUnavailable as exc:
            self.on_outage(exc)
            self._arm(held, self._backoff_s, self._due)
            return
        received_ns = time.monotonic_ns()
        self.clock.observe(result.now_us, sent_ns, received_ns)
        self._on_store_ok()
        self._on_claim(held, result, sent_ns, received_ns)

    def _hand_over(self, held: Held) -> None:
        """A ticketed task was revoked or expired: the next task queued here for its bucket
        takes its ticket and slot, so no interval goes unused (without one, the slot passes)."""
        self._forget(held)
        queued = self._queued.get(held.bucket)
        while queued:
            successor = queued.popleft()
            if successor.request.revoked():
                self._forget(successor)
                continue
            logger.info(
                "interval %s: task %s revoked while held, ticket %d goes to task %s",
                held.bucket,
                held.request.id,
                held.ticket,
                successor.request.id,
            )
            successor.ticketed = True
            self._ticketed[successor.bucket] += 1
            successor.granted(held.epoch, held.ticket, held.slot_us)
            self._claim(successor)
            return
        logger.info("interval %s: task %s revoked while held", held.bucket, held.request.id)
        self._fill(held.bucket)

    def _reach_us(self) -> tuple[int, int]:
        """(lead, handoff) of a claim: the handoff also covers the reply's way back from the
        store (half the best recent round trip), so a worker behind a slow link is admitted a
        start it can still reach; the claim comes at least that early (at most MAX_LEAD_US)."""
        handoff_us = self.settings.handoff_us + self.clock.one_way_us()
        return lead_for(self.settings.lead_us, handoff_us), handoff_us

    def _wait_for_pool(self, held: Held) -> None:
        """Queue a due task behind those already waiting for a pool process; one poll for all
        of them (a task whose timer fires as the pool frees must not jump the queue)."""
        held.state = "waiting-pool"
        entry = (held.ticket, held.bucket, next(self._waiting_seq), held)
        heapq.heappush(self._pool_waiting, entry)
        self._ensure_pool_poll()

    def _ensure_pool_poll(self) -> None:
        if self._pool_poll is None:
            self._pool_poll = self.timer.call_after(POOL_POLL_S, self._on_pool_poll, priority=6)

    def _on_pool_poll(self) -> None:
        """Claim waiting tasks lowest ticket first while pool processes are free: a worker
        that claimed in timer order would pass its own earlier tickets (they re-ticket)."""
        self._pool_poll = None
        while self._pool_waiting and self._pool_slots() > 0:
            held = heapq.heappop(self._pool_waiting)[-1]
            if held.state != "waiting-pool":
                continue
            held.state = "granted"
            self._claim(held)
        if self._pool_waiting:
            self._ensure_pool_poll()

    def _on_claim(self, held: Held, result: Claim, sent_ns: int, received_ns: int) -> None:
        stats = self.stats[held.bucket]
        outcome = result.outcome
        stats.last_paused = outcome is Outcome.PAUSED
        if outcome is Outcome.OK:
            stats.claims += 1
            start_ns = self.clock.local_ns(
                result.now_us + result.delay_us, sent_ns, received_ns, result.delay_us
            )
            self._start(held, start_ns)
        elif outcome is Outcome.WAIT:
            stats.waits += 1
            self._arm(held, max(0, result.delay_us - self._reach_us()[0]) / 1e6, self._due)
        elif outcome is Outcome.PAUSED:
            stats.paused += 1
            held.state = "paused"
            self.paused[held.bucket].append(held)
            self._ensure_pause_poll(held.bucket)
        elif outcome is Outcome.HELD:
            self._wait_for_lease(held, result.delay_us, self._due)
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
                self._grant(held)
            else:
                self._requeue(held)
        else:
            stats.duplicates += 1
            logger.info(
                "interval %s: task %s already done elsewhere, dropping duplicate copy",
                held.bucket,
                held.request.id,
            )
            self._drop(held, ack=True)

    def _wait_for_lease(self, held: Held, left_us: int, then: Callable[[Held], None]) -> None:
        """The task runs under another holder's lease: this copy gives up its place among the
        tickets (it waits for that lease, not for a process here) and looks again when the
        lease may have ended, or within ``HELD_RECHECK_S`` (a done task's copy is dropped)."""
        self.stats[held.bucket].helds += 1
        held.state = "held-by-other"
        self._unticket(held)
        self._arm(held, min(left_us / 1e6, HELD_RECHECK_S) + 0.001, then)
        self._fill(held.bucket)

    def _requeue(self, held: Held) -> None:
        """Back to the front of the bucket's queue, to take a ticket when a process is free."""
        self._enqueue(held, front=True)

    def _start(self, held: Held, start_ns: int) -> None:
        held.state = "started"
        held.request.request_dict[CLAIMED_HEADER] = time.monotonic_ns()
        held.request.request_dict[START_HEADER] = start_ns
        held.request.request_dict[SPIN_HEADER] = spin_ns_for(held.interval_us)
        held.request.request_dict[CLAIM_HEADER] = held.claim_args(self._reach_us()[1])
        self._in_pool += 1
        self._released[held.request.id] = held
        if held.acks_late:
            self._leases[held.key] = held.holder
            self._ensure_renew()
        elif self.store.posts_done:
            held.request.request_dict[MARK_HEADER] = True
        self._forget(held)
        held.release(held.request)

    def _drop(self, held: Held, *, ack: bool) -> None:
        self._forget(held)
        if ack:
            held.request.acknowledge()
        self._fill(held.bucket)

    def _forget(self, held: Held) -> None:
        if held.entry is not None:
            self._cancel(held.entry)
            held.entry = None
        self._unticket(held)
        with contextlib.suppress(ValueError):  # already forgotten
            self.held.get(held.bucket, []).remove(held)
            self._held_n -= 1
            self._qos().decrement_eventually()
            if not self.held[held.bucket]:
                self._prune(held.bucket)
            if self.overflow is not None:
                self.overflow.left(held.queue, held.bucket)
        self._apply_caps(held.queue)

    def _prune(self, bucket: str) -> None:
        """A bucket holds nothing here: drop its entries (many tenants come and go); keep its
        counters while fewer than ``MAX_STATS`` buckets have them."""
        self.held.pop(bucket, None)
        if bucket in self._queued and not self._queued[bucket]:
            del self._queued[bucket]
        self.flow.latest_due_ns.pop(bucket, None)
        if len(self.stats) > MAX_STATS:
            self.stats.pop(bucket, None)

    def _unticket(self, held: Held) -> None:
        if held.ticketed:
            held.ticketed = False
            self._ticketed[held.bucket] -= 1
            if not self._ticketed[held.bucket]:
                del self._ticketed[held.bucket]

    def _apply_caps(self, queue: str | None) -> None:
        """Stop fetching at ``max_held`` tasks or a slot ``max_ahead_s`` away; resume at half.

        Half leaves a buffer for the broker's resume latency (a Redis broker's BRPOP: up to 1 s).
        """
        if not queue:
            return
        if self.overflow is not None and self.overflow.active:
            if queue in self.flow.stopped:  # stopped while parking was out
                self.flow.stopped.discard(queue)
                self._resume_queue(queue)
            return
        now_ns = time.monotonic_ns()
        count, ahead_s = 0, 0.0
        for bucket, items in self.held.items():
            if items and items[0].queue == queue:
                count = max(count, len(items))
                due_ns = self.flow.latest_due_ns.get(bucket, now_ns)
                ahead_s = max(ahead_s, (due_ns - now_ns) / 1e9)
        if queue not in self.flow.stopped:
            if count >= self.settings.max_held or ahead_s >= self.settings.max_ahead_s:
                self.flow.stopped.add(queue)
                self._stop_queue(queue)
        elif count <= self.settings.max_held // 2 and ahead_s <= self.settings.max_ahead_s / 2:
            self.flow.stopped.discard(queue)
            self._resume_queue(queue)

    # -- pause -----------------------------------------------------------------------------

    def wake(self, bucket: str) -> None:
        """Re-claim every task held because ``bucket`` was paused (on unpause)."""
        waiting = self.paused.pop(bucket, [])
        entry = self._pause_polls.pop(bucket, None)
        if entry is not None:
            self._cancel(entry)
        for held in sorted(waiting, key=lambda h: h.ticket):
            if held.state == "paused":
                self._due(held)

    def _ensure_pause_poll(self, bucket: str) -> None:
        if bucket not in self._pause_polls:
            self._pause_polls[bucket] = self.timer.call_after(
                self.settings.pause_poll_s, self._pause_poll, (bucket,), priority=7
            )

    def _pause_poll(self, bucket: str) -> None:
        self._pause_polls.pop(bucket, None)
        if not self.paused.get(bucket):
            return
        interval_us = self.paused[bucket][0].interval_us
        try:
            paused = self.store.status(bucket, interval_us).paused
        except StoreUnavailable as exc:
            self.on_outage(exc)
            paused = True
        if paused:
            self._ensure_pause_poll(bucket)
        else:
            self.wake(bucket)

    # -- done marks and leases -------------------------------------------------------------

    def mark_done(self, bucket: str, task_id: str, retries: int) -> None:
        """Record (off the critical path) that this message was acknowledged: the mark goes
        on the event loop's next turn, with a take in this turn if there is one."""
        self._leases.pop((bucket, task_id, retries), None)
        self._done_pending.append(TaskCopy(bucket, task_id, retries))
        if self._done_entry is None:
            self._done_entry = self.timer.call_after(DONE_FLUSH_S, self.flush_done, priority=8)

    def lease_ended(self, bucket: str, task_id: str, retries: int) -> None:
        """The task was requeued (``Reject(requeue=True)``, a lost pool process): end its lease
        in the store too, so the copy the broker delivers again starts without waiting for it."""
        holder = self._leases.pop((bucket, task_id, retries), None)
        if holder is None:
            return
        try:
            self.store.renew(bucket, task_id, retries, holder, 0)
        except StoreUnavailable as exc:
            self.on_outage(exc)
            logger.warning(
                "interval %s: task %s requeued; its copy waits for the lease to lapse (%.0fs)",
                bucket,
                task_id,
                self.settings.lease_us / 1e6,
            )

    def flush_done(self) -> None:
        """Send pending done marks in one pipeline; retried with backoff while the store is out."""
        self._done_entry = None
        batch, self._done_pending = self._done_pending, []
        if not batch:
            return
        try:
            self.store.done(batch, self.settings.dedupe_ttl_us)
        except StoreUnavailable as exc:
            self.on_outage(exc)
            self._done_pending = batch + self._done_pending
            self._done_entry = self.timer.call_after(self._backoff_s, self.flush_done, priority=8)
            return
        self._on_store_ok()

    def _ensure_renew(self) -> None:
        if self._renew_entry is None and self._leases:
            self._renew_entry = self.timer.call_after(
                self.settings.lease_us / 3e6, self._renew, priority=8
            )

    def _renew(self) -> None:
        self._renew_entry = None
        for (bucket, task_id, retries), holder in list(self._leases.items()):
            try:
                renewed = self.store.renew(bucket, task_id, retries, holder, self.settings.lease_us)
            except StoreUnavailable as exc:
                self.on_outage(exc)
                break
            if not renewed:
                self._leases.pop((bucket, task_id, retries), None)
        self._ensure_renew()

    # -- store outages ---------------------------------------------------------------------

    def on_outage(self, exc: Exception) -> None:
        """The store could not be reached: log the outage once, back off the retries."""
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            logger.error(
                "interval store unreachable (%s): holding %d task(s), retrying with backoff",
                exc,
                sum(len(v) for v in self.held.values()),
            )
        self._backoff_s = min(self._backoff_s * 2, self.settings.retry_max_s)

    def _on_store_ok(self) -> None:
        if self._outage_since is not None:
            logger.warning(
                "interval store reachable again after %.1fs",
                time.monotonic() - self._outage_since,
            )
            self._outage_since = None
            self._backoff_s = 0.05

    # -- timers and lifecycle --------------------------------------------------------------

    def _arm(self, held: Held, delay_s: float, callback: Callable[[Held], None]) -> None:
        held.entry = self.timer.call_after(delay_s, callback, (held,), priority=6)

    def _cancel(self, entry: Any) -> None:
        try:
            self.timer.cancel(entry)
        except Exception:  # pragma: no cover - a timer that already fired or is gone
            logger.debug("interval: timer entry already gone", exc_info=True)

    def connection_lost(self) -> None:
        """The channel is gone: its unacked messages return to the broker, so drop our copies."""
        self._forget_released()
        dropped = 0
        for items in list(self.held.values()):
            for held in list(items):
                if held.entry is not None:
                    self._cancel(held.entry)
                dropped += 1
        for entry in self._pause_polls.values():
            self._cancel(entry)
        for entry in (self._pool_poll, self._fill_entry, self._starved_entry):
            if entry is not None:
                self._cancel(entry)
        self._pool_poll = self._fill_entry = self._starved_entry = None
        self._pool_waiting.clear()
        self._queued.clear()
        self._ticketed.clear()
        self.held.clear()
        self._held_n = 0
        if self.overflow is not None:
            self.overflow.stop()
        self.paused.clear()
        self._pause_polls.clear()
        self.flow.stopped.clear()
        if dropped:
            logger.warning(
                "interval: connection lost, %d held task(s) return to the broker", dropped
            )

    def _forget_released(self) -> None:
        """Tasks released to the pool but not accepted when the channel closed: Celery drops
        them from the pool (a process may still run one that was already written to it), and
        never reports their end. Stop renewing their leases, so that a copy waits for the lease
        to lapse, not forever; say which tasks, since their copies start that much later."""
        orphans, self._released = list(self._released.values()), {}
        if not orphans:
            return
        self._in_pool -= len(orphans)
        for held in orphans:
            self._leases.pop(held.key, None)
        logger.warning(
            "interval: connection lost with %d task(s) released to the pool but not yet accepted "
            "(%s): their copies wait for the lease (up to %.0fs) before they can run",
            len(orphans),
            ", ".join(h.request.id for h in orphans),
            self.settings.lease_us / 1e6,
        )

    def close(self) -> None:
        """Flush pending done marks and release the store."""
        self.flush_done()
        self.store.close()

    def snapshot(
        self,
        top: int = 20,
        match: str | None = None,
        buckets: list[str] | None = None,
        tasks: int = 10,
    ) -> dict[str, Any]:
        """Per-bucket figures for ``inspect interval_stats``: the ``top`` buckets (0 = all) with
        the most held tasks, of those whose names match the glob ``match`` and are among
        ``buckets`` (when given), each listing its first ``tasks`` held tasks by ticket;
        ``_buckets_total`` counts the buckets that matched."""
        counts = Counter({b: len(v) for b, v in self.held.items()})
        names = set(self.stats) | set(counts)
        if match is not None:
            names = {b for b in names if fnmatchcase(b, match)}
        if buckets is not None:
            names &= set(buckets)
        chosen = sorted(names, key=lambda b: (-counts.get(b, 0), b))
        out: dict[str, Any] = {}
        for bucket in chosen[:top] if top else chosen:
            st = self.stats[bucket]
            held = self.held.get(bucket, [])
            out[bucket] = {
                "interval_s": st.interval_us / 1e6,
                "paused": st.last_paused,
                "held": counts.get(bucket, 0),
                "held_tasks": [
                    {"id": h.request.id, "ticket": h.ticket, "state": h.state}
                    for h in heapq.nsmallest(tasks, held, key=lambda h: h.ticket)
                ],
                "grants": st.grants,
                "claims": st.claims,
                "waits": st.waits,
                "retickets": st.retickets,
                "duplicates": st.duplicates,
                "held_by_other": st.helds,
                "paused_claims": st.paused,
            }
        out["_buckets_total"] = len(names)
        out["_queues_stopped"] = sorted(self.flow.stopped)
        if self.overflow is not None:
            out["_overflow"] = self.overflow.snapshot()
        return out
