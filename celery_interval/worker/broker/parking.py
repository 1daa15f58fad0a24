"""Parking: tasks a worker cannot hold wait in a per-bucket broker queue, and come back in order."""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery_interval.buckets import overflow_queue_name
from celery_interval.config import Settings
from celery_interval.errors import StoreUnavailable, UnknownBucket
from celery_interval.stores.overflow import OverflowIndex
from celery_interval.worker.broker.directory import Directory
from celery_interval.worker.broker.overflow_queues import OverflowBroker, ack_each, log_trail

if TYPE_CHECKING:
    from celery_interval.worker.holding import Holding

__all__ = ["Parking", "hold_cap"]

logger = logging.getLogger("celery_interval.worker")

#: How often a worker looks for buckets with parked tasks that nobody refills (seconds).
POLL_S = 0.25
#: How often a worker lists again the buckets it parked into (a store that lost its state
#: loses the index; the parked tasks are in the broker and must stay findable).
RELIST_S = 5.0
#: A bucket stays listed while tasks taken back from it are unacked here (``index.hold``,
#: renewed at each relisting) and for this long after, plus the time the broker takes to
#: return a dead worker's unacked messages: they return to its overflow queue if this
#: worker's connection goes, and must be found there even if the worker went with it.
TAKEN_LEASE_US = round(2 * RELIST_S * 1e6)
#: The most parked tasks one refill takes back in one event-loop turn.
REFILL_BATCH = 64
#: Tasks to park go in batches of at most this many (one confirm wait, two store calls) ...
PARK_BATCH = 128
#: ... gathered for at most this long (seconds).
PARK_GATHER_S = 0.005


def hold_cap(settings: Settings, interval_us: int) -> int:
    """How many of one bucket's tasks a worker holds: about ``hold_ahead_s`` of its pace, at
    least one, at most ``max_held`` (the next is taken back as the held one starts)."""
    ahead = math.ceil(settings.hold_ahead_s * 1e6 / max(1, interval_us))
    return max(1, min(settings.max_held, ahead))


@dataclass
class _Known:
    """A bucket this worker parked into or refilled from (FIFO: its arrivals park too)."""

    queue: str
    interval_us: int


class Parking:
    """Decides which received tasks park, parks them in batches, and refills buckets as their
    held tasks leave; the slot cycle itself is ``slots.SlotCycle``."""

    def __init__(
        self,
        settings: Settings,
        index: OverflowIndex,
        timer: Any,
        holding: Holding,
        hold: Callable[[Any], None],
        qos: Callable[[], Any],
    ) -> None:
        self.settings = settings
        self.index = index
        self.timer = timer
        self.broker: OverflowBroker | None = None
        self._holding = holding
        self._hold = hold
        self._qos = qos
        self.known: dict[tuple[str, str], _Known] = {}
        self._pending: list[Any] = []
        #: Batches published and not yet confirmed by the broker (their originals unacked).
        self._unsettled: list[list[Any]] = []
        self._flush_entry: Any = None
        self._refill_wanted: set[tuple[str, str]] = set()
        self._refill_entry: Any = None
        #: Messages taken back from each bucket's overflow queue and not known to be acked.
        self._taken: dict[tuple[str, str], list[Any]] = {}
        #: Buckets whose taken messages went back to their overflow queue with the connection.
        self._returned: set[tuple[str, str]] = set()
        self._taken_lease_us = TAKEN_LEASE_US
        self.directory = Directory(index)
        self._poll_entry: Any = None
        self._relisted_s = 0.0
        self._busy = False
        self.down_since: float | None = None
        self.parked = 0
        self.refilled = 0

    @property
    def active(self) -> bool:
        """Whether tasks can park now (a broker side attached, the last park went through)."""
        return self.broker is not None and self.down_since is None

    # -- the decision -------------------------------------------------------------------------

    def cap(self, interval_us: int) -> int:
        return hold_cap(self.settings, interval_us)

    def parks(self, held: Any) -> bool:
        """Park ``held`` (True) when its bucket already has parked tasks (they go first), its
        bucket holds ``cap`` here, or this worker holds ``max_held_total``."""
        if self.broker is None or held.unparked or not held.queue or self.down_since is not None:
            return False
        key = (held.queue, held.bucket)
        if not (
            key in self.known
            or self._holding.held_in(held.bucket) >= self.cap(held.interval_us)
            or self._holding.held_total() >= self.settings.max_held_total
        ):
            return False
        self.known.setdefault(key, _Known(held.queue, held.interval_us))
        self._pending.append(held)
        self._qos().increment_eventually()  # unacked until parked: the prefetch makes room
        if len(self._pending) >= PARK_BATCH:
            self._flush_soon(0.0)
        elif self._flush_entry is None:
            self._flush_soon(PARK_GATHER_S)
        return True

    def _flush_soon(self, delay_s: float) -> None:
        if self._flush_entry is not None:
            self._flush_entry.cancel()
        self._flush_entry = self.timer.call_after(delay_s, self.flush, priority=6)

    # -- parking ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Park the pending tasks: list their buckets and publish their copies; the originals
        are acked once the broker confirms the copies (``_settled``), without blocking the
        event loop. A worker killed or a connection lost in between leaves a copy and the
        original: the store's dedupe drops one."""
        self._flush_entry = None
        if not self._pending or self.broker is None:
            return
        if self._busy:  # a refill is taking tasks back: park right after it
            self._flush_soon(PARK_GATHER_S)
            return
        batch, self._pending = self._pending[:PARK_BATCH], self._pending[PARK_BATCH:]
        members = sorted({(h.queue, h.bucket) for h in batch})
        self._busy = True
        try:
            self._unsettled.append(batch)
            # Listed before published, in the store's index and in the broker's directory: a
            # worker killed after its originals' acks leaves no copy that neither lists (the
            # store may lose its index too). A directory entry the broker refused is logged and
            # written again at the next park.
            self.index.park(members)
            self.directory.register(self.broker, members)
            self.broker.publish(
                [
                    (overflow_queue_name(h.queue, h.bucket), h.request.message, h.queue)
                    for h in batch
                ],
                functools.partial(self._settled, batch, members),
            )
            log_trail("parking", (h.request.message for h in batch))
        except Exception as exc:
            if self._forget(batch):
                self._fail(exc, batch)
            return
        finally:
            self._busy = False
        if self._pending:
            self._flush_soon(0.0)

    def _settled(self, batch: list[Any], members: list[tuple[str, str]], refused: Any) -> None:
        """The broker confirmed a batch's copies (ack its originals) or refused them (a nack:
        no copy was taken, so the batch is held here)."""
        if not self._forget(batch):
            return  # the connection went first: the broker returns the originals
        if refused is not None:
            self._fail(refused, batch)
            return
        # A refill that found the queue empty meanwhile keeps it listed; if the store is
        # down, the bucket is still known here and listed again at the next relisting.
        with contextlib.suppress(StoreUnavailable):
            self.index.park(members)
        ack_each([(h.bucket, h.request.message) for h in batch])
        log_trail("parked, originals acked", (h.request.message for h in batch))
        for _ in batch:
            self._qos().decrement_eventually()
        self.parked += len(batch)
        self._on_ok()
        for queue, bucket in members:
            self.want_refill(queue, bucket)

    def _forget(self, batch: list[Any]) -> bool:
        """Take ``batch`` off the unsettled ones; False if it was not there."""
        left = [unsettled for unsettled in self._unsettled if unsettled is not batch]
        found, self._unsettled = len(left) < len(self._unsettled), left
        return found

    def _fail(self, exc: Exception, batch: list[Any]) -> None:
        """The store or the broker refused: hold the batch here (the cap then stops fetching)."""
        if self.down_since is None:
            self.down_since = time.monotonic()
            logger.error(
                "interval: cannot park %d task(s) (%s): holding them, fetching stops at the cap",
                len(batch),
                exc,
            )
        log_trail("not parked, held here", (h.request.message for h in batch + self._pending))
        for held in batch + self._pending:
            held.unparked = True
            self._qos().decrement_eventually()
            self._hold(held)
        self._pending = []

    def _on_ok(self) -> None:
        if self.down_since is not None:
            logger.warning(
                "interval: parking works again after %.1fs", time.monotonic() - self.down_since
            )
            self.down_since = None

    # -- refilling ----------------------------------------------------------------------------

    def left(self, queue: str | None, bucket: str) -> None:
        """A held task of ``bucket`` left this worker: once half its cap is gone, refill it from
        its parked tasks (in one batch: one index read and one write per refill)."""
        known = self.known.get((queue, bucket)) if queue is not None else None
        if known is not None and self._holding.held_in(bucket) <= self.cap(known.interval_us) // 2:
            self.want_refill(known.queue, bucket)

    def want_refill(self, queue: str, bucket: str) -> None:
        self._refill_wanted.add((queue, bucket))
        if self._refill_entry is None:
            self._refill_entry = self.timer.call_after(0.0, self._refill_all, priority=6)

    def _refill_all(self) -> None:
        self._refill_entry = None
        wanted, self._refill_wanted = self._refill_wanted, set()
        for queue, bucket in sorted(wanted):
            self.refill(queue, bucket, None)

    def refill(self, queue: str, bucket: str, changes: int | None) -> int:
        """Take back up to the bucket's free room from its overflow queue, in order: each copy
        goes to the task handler; an empty queue unlists the bucket (unless parked into since
        ``changes`` was read). Returns how many came back."""
        if self.broker is None or self._busy or not self.broker.consumes(queue):
            return 0
        interval_us = self._interval_us(queue, bucket)
        room = min(
            self.cap(interval_us) - self._holding.held_in(bucket),
            self.settings.max_held_total - self._holding.held_total(),
            REFILL_BATCH,
        )
        if room <= 0:
            return 0
        name = overflow_queue_name(queue, bucket)
        got = 0
        self._busy = True
        try:
            if changes is None:
                changes = self.index.changes(queue, bucket)
            emptied = False
            while got < room:
                message = self.broker.get(name)
                if message is None:
                    emptied = self.index.drop_if(queue, bucket, changes)
                    if emptied:
                        self.known.pop((queue, bucket), None)
                    break
                if not got:
                    try:
                        self.index.hold([(queue, bucket)], self._taken_lease_us)
                    except StoreUnavailable:
                        message.requeue()  # taken but not held: back to the head of its queue
                        raise
                if not self._deliver(self.broker, message, queue, bucket):
                    break
                got += 1
            if got and not emptied:
                self.known.setdefault((queue, bucket), _Known(queue, interval_us))
                self.index.defer(queue, bucket, got * interval_us)
        except StoreUnavailable as exc:
            logger.warning("interval %s: refill waits for the store (%s)", bucket, exc)
        finally:
            self._busy = False
        self.refilled += got
        if got == room and self._holding.held_in(bucket) < self.cap(interval_us):
            self.want_refill(queue, bucket)  # more room: another turn, not this one
        return got

    def _deliver(self, broker: OverflowBroker, message: Any, queue: str, bucket: str) -> bool:
        """Hand a message taken back to the task handler; one it fails on goes back to the head
        of its overflow queue (the next refill takes it again), never left unacked here."""
        try:
            broker.deliver(message, queue)
        except Exception as exc:
            logger.warning("interval %s: a task taken back was put back (%r)", bucket, exc)
            with contextlib.suppress(Exception):  # else the broker returns it with the connection
                message.requeue()
            return False
        self._taken.setdefault((queue, bucket), []).append(message)
        log_trail(f"taken back ({bucket})", [message])
        return True

    def _unacked(self, key: tuple[str, str]) -> bool:
        """Whether messages taken back from ``key``'s overflow queue are still unacked here."""
        left = [m for m in self._taken.get(key, ()) if not m.acknowledged]
        if left:
            self._taken[key] = left
        else:
            self._taken.pop(key, None)
        return bool(left)

    def _interval_us(self, queue: str, bucket: str) -> int:
        known = self.known.get((queue, bucket))
        if known is not None:
            return known.interval_us
        try:
            return self.settings.interval_us(bucket)
        except UnknownBucket:  # a bucket named apart from its queue: the queue's pace
            return self.settings.interval_us(queue)

    # -- the poll -----------------------------------------------------------------------------

    def start(self, broker: OverflowBroker) -> None:
        """Begin (again, after a reconnect) with the consumer's broker side."""
        self.broker = broker
        self._taken_lease_us = TAKEN_LEASE_US + round(broker.returns_unacked_within_s() * 1e6)
        if self._poll_entry is None:
            self._poll_entry = self.timer.call_repeatedly(POLL_S, self.poll, priority=7)
        returned, self._returned = sorted(self._returned), set()
        try:
            self.index.park(returned)
            for queue, bucket in returned:
                self.index.defer(queue, bucket, 0)
        except StoreUnavailable:  # listed while held: due when the hold ends
            pass

    def stop(self) -> None:
        """The connection is gone: pending parks return to the broker with their originals."""
        if self.broker is not None:
            self.broker.close()
        self.broker = None
        self._returned.update(key for key in list(self._taken) if self._unacked(key))
        taken = itertools.chain.from_iterable(self._taken.values())
        log_trail("connection lost, taken back", (m for m in taken if not m.acknowledged))
        self._taken.clear()
        for _ in [*self._pending, *itertools.chain.from_iterable(self._unsettled)]:
            self._qos().decrement_eventually()
        self._pending.clear()
        self._unsettled.clear()
        self.directory.forget()
        for entry in (self._flush_entry, self._refill_entry, self._poll_entry):
            if entry is not None:
                entry.cancel()
        self._flush_entry = self._refill_entry = self._poll_entry = None
        self._refill_wanted.clear()

    def poll(self) -> None:
        """Refill due buckets nobody here holds (their worker left), oldest due first; list
        again, now and then, the buckets this worker knows have parked tasks."""
        if self.broker is None or self._busy:
            return
        room = self.settings.max_held_total - self._holding.held_total()
        try:
            if self.down_since is not None:
                self.index.size()  # parking stopped on an error: resume once the store answers
                self._on_ok()
            now_s = time.monotonic()
            if self.known and now_s - self._relisted_s >= RELIST_S:
                self._relisted_s = now_s
                self.index.park(sorted(self.known))
                holding = [key for key in list(self._taken) if self._unacked(key)]
                self.index.hold(sorted(holding), self._taken_lease_us)
            due = self.index.due(min(256, max(1, room)))
        except StoreUnavailable:
            return
        for parking in due:
            if room <= 0:
                break
            room -= self.refill(parking.queue, parking.bucket, parking.changes)
        if self.broker is not None:
            self.directory.sweep_if_due(self.broker)

    def snapshot(self) -> dict[str, Any]:
        """Figures for ``inspect interval_stats``."""
        return {
            "parked": self.parked,
            "refilled": self.refilled,
            "known": len(self.known),
            "pending": len(self._pending),
            "down": self.down_since is not None,
        }
