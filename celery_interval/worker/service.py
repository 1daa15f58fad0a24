"""IntervalService: one consumer's interval tasks from receipt to the pool, made of its parts."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from celery_interval.config import Settings
from celery_interval.stores.base import Store
from celery_interval.stores.overflow import OverflowIndex
from celery_interval.worker.broker.overflow_queues import log_trail
from celery_interval.worker.broker.parking import Parking
from celery_interval.worker.held import Held
from celery_interval.worker.holding import Holding
from celery_interval.worker.notify import Notify, iso_of
from celery_interval.worker.slots import SlotCycle, SlotParts
from celery_interval.worker.stats import interval_stats
from celery_interval.worker.store.done import DoneMarks
from celery_interval.worker.store.leases import Leases
from celery_interval.worker.store.outage import StoreOutage
from celery_interval.worker.store.places import RunningPlaces
from celery_interval.worker.timer import cancel

__all__ = ["IntervalService"]

logger = logging.getLogger("celery_interval.worker")


class IntervalService:
    """Plain object behind the bootstep: no I/O of its own beyond the store and the timer.

    It parks what this worker cannot hold (``parking``), holds the rest (``holding``) and takes
    each held task through its slot (``slots``); ``paused``, ``done``, ``leases`` and ``outage``
    keep what a claim, an ack or a failed store call leaves behind.
    """

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
        notify: Notify | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.timer = timer
        self.hostname = hostname
        self.notify = notify or Notify(lambda: None)
        self._call_soon = call_soon
        self._loop_thread = threading.get_ident()
        #: Channels lost so far: a message that waits for a retry from before the last one went
        #: back to the broker with its channel.
        self.connection_losses = 0
        self.holding = Holding(settings, qos, stop_queue, resume_queue)
        self.parking: Parking | None = None
        if overflow_index is not None and settings.overflow:
            self.parking = Parking(
                settings, overflow_index, timer, self.holding, hold=self.receive, qos=qos
            )
            self.holding.parking = self.parking
        self.outage = StoreOutage(settings.retry_max_s, self.holding.held_total, timer)
        self.done = DoneMarks(settings, store, timer, self.outage)
        self.leases = Leases(settings, store, timer, self.outage)
        self.places = RunningPlaces(settings, store, timer, self.outage)
        parts = SlotParts(
            settings, store, timer, self.holding, self.done, self.leases, self.outage,
            self.places, self.notify,
        )  # fmt: skip
        self.slots = SlotCycle(parts, pool_slots)
        self.paused = self.slots.paused

    def receive(self, held: Held) -> None:
        """Take a new message: raise prefetch for it, queue it for a ticket (an ETA or countdown
        task once it is due), apply the hold caps; or park it, when this worker cannot hold it.
        A copy of what began here, or a redelivered copy whose done mark the store holds, asks
        for its grant at once, which drops it (and says so in the ledger): held or parked, it
        could outlive the store's state."""
        if self.slots.began_here(held) or (held.redelivered and self.done.marked(held.copy)):
            self.holding.add(held)
            self.slots.grant(held)
            return
        if self.parking is not None and self.parking.parks(held):
            return
        self.holding.add(held)
        self.slots.admit(held)
        self.notify.received(held)
        self.holding.apply_caps(held.queue, held.bucket)

    def from_pool(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn`` on the event loop's thread: at once there, else on the loop's next turn (a
        threads pool reports ends and acks from its own threads; the timer is not thread-safe).
        """
        if self._call_soon is None or threading.get_ident() == self._loop_thread:
            fn(*args)
        else:
            self._call_soon(fn, *args)

    def body_ended(self, request: Any) -> None:
        """A pool process finished a task (on the loop's thread): its place in a capped bucket
        is free at once (a task here waiting for one claims it), and the process takes the next
        task."""
        bucket = self.places.free(request)
        self.slots.pool_freed()
        if bucket is not None:
            self.slots.place_freed(bucket)

    def new_holder(self) -> str:
        """A holder id unique to one delivery: ``<worker>/<48 random bits as 12 hex digits>``
        (the audit reads the worker from it)."""
        return f"{self.hostname}/{os.urandom(6).hex()}"

    def mark_done(self, bucket: str, task_id: str, retries: int) -> None:
        """Record (off the critical path) that this message was acknowledged: the mark goes
        on the event loop's next turn, with a take in this turn if there is one."""
        self.leases.drop((bucket, task_id, retries))
        self.done.add(bucket, task_id, retries)

    def wake(self, bucket: str) -> None:
        """Re-claim every task held because ``bucket`` was paused (on unpause)."""
        self.paused.wake(bucket)

    def connection_lost(self) -> None:
        """The channel is gone: its unacked messages return to the broker, so drop our copies."""
        self.connection_losses += 1
        self.slots.forget_released()
        self.slots.births.off_loop()  # after the orphans' first read: those found count
        dropped = [held for items in self.holding.held.values() for held in items]
        for held in dropped:
            if held.entry is not None:
                cancel(self.timer, held.entry)
                held.entry = None
        log_trail("connection lost, held", (getattr(h.request, "message", None) for h in dropped))
        self.paused.clear()
        self.slots.clear()
        self.holding.clear()
        if self.parking is not None:
            self.parking.stop()
        if dropped:
            logger.warning(
                "interval: connection lost, %d held task(s) return to the broker", len(dropped)
            )

    def connection_breaking(self) -> None:
        """The channel broke and Celery is about to restore its messages (seconds, with no
        timer running): read the marks of what the pool was handed, and the store's birth,
        off the loop from now on (``connection_lost`` follows). Celery restores the lost
        channel's messages before it stops the consumer, and a store that loses its state
        meanwhile would take the marks of the tasks released but not accepted before
        ``SlotCycle.forget_released`` reads them."""
        released = [held.copy for held in self.slots.pool.released.values()]
        self.slots.done.look_for_marks([*released, *self.slots.done.acks_waiting.values()])
        self.slots.births.off_loop()

    def connected(self) -> None:
        """The channel is (back) up: the loop's timers run again."""
        self.slots.births.on_loop()

    def accepted_late(self, held: Held) -> None:
        """A task taken for orphaned as the channel closed was accepted after all (a threads
        pool runs what it was given): it runs here, so its lease and place are renewed again."""
        logger.warning(
            "interval %s: task %s was accepted by the pool after the connection closed: it runs",
            held.bucket,
            held.request.id,
        )
        if held.cap is not None:
            self.places.hold(held.request, held.copy, held.cap)
        if held.acks_late:
            self.leases.hold(held.key, held.holder)

    def close(self) -> None:
        """Flush pending done marks and release the store."""
        self.done.flush()
        self.store.close()

    def scheduled(self) -> list[dict[str, Any]]:
        """The tasks held here for their slot, as ``inspect scheduled`` lists ETA tasks."""
        return [
            {
                "eta": iso_of(held.slot_wall_s) or (req.eta and req.eta.isoformat()),
                "priority": held.rank,
                "request": req.info(),
                "interval": {
                    "bucket": held.bucket,
                    "ticket": held.ticket,
                    "state": held.state.value,
                },
            }
            for items in self.holding.held.values()
            for held in items
            for req in (held.request,)
        ]

    def snapshot(
        self,
        top: int = 20,
        match: str | None = None,
        buckets: list[str] | None = None,
        tasks: int = 10,
    ) -> dict[str, Any]:
        """Per-bucket figures for ``inspect interval_stats`` (see ``stats.interval_stats``)."""
        running = self.places.by_bucket()
        return interval_stats(self.holding, self.parking, running, top, match, buckets, tasks)
