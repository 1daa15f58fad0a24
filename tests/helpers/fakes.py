"""Fakes of what an IntervalService touches (a Celery request, the worker's timer, QoS), and a
service for bucket api on a MemoryStore built on them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from celery import Celery

from celery_interval.config import settings_of
from celery_interval.stores.memory import MemoryStore
from celery_interval.worker.held import Held
from celery_interval.worker.service import IntervalService
from tests.helpers.fakeclock import Clock

INTERVAL_US = 50_000
POOL_PROCESSES = 2


@dataclass
class Request:
    """The part of a Celery request the service touches."""

    id: str
    request_dict: dict[str, Any] = field(default_factory=dict)
    acked: bool = False
    task: Any = None

    def revoked(self) -> bool:
        return False

    def acknowledge(self) -> None:
        self.acked = True


class Entry(tuple[float, Any, tuple[Any, ...]]):
    """A timer entry, ``(delay_s, fn, args)``, cancellable as kombu's are; ``due_us`` is when
    it fires on the timer's clock (its delay alone when the timer has none)."""

    timer: Timer
    due_us: int

    def __new__(cls, delay_s: float, fn: Any, args: tuple[Any, ...], timer: Timer) -> Entry:
        entry = super().__new__(cls, (delay_s, fn, args))
        entry.timer = timer
        armed_us = timer.clock.now_us if timer.clock is not None else 0
        entry.due_us = armed_us + round(delay_s * 1e6)
        return entry

    @property
    def fn(self) -> Any:
        return self[1]

    @property
    def args(self) -> tuple[Any, ...]:
        return self[2]

    def cancel(self) -> None:
        self.timer.cancel(self)


class Timer:
    """Celery's timer surface; entries wait until the test fires them (``run``: in order).
    Given the store's ``clock``, an entry is due its delay after the clock read when armed."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock
        self.entries: list[Entry] = []
        self.repeating: list[Entry] = []

    def call_after(self, delay_s: float, fn: Any, args: tuple[Any, ...] = (), **_: Any) -> Any:
        entry = Entry(delay_s, fn, args, self)
        self.entries.append(entry)
        return entry

    def call_repeatedly(self, every_s: float, fn: Any, args: tuple[Any, ...] = (), **_: Any) -> Any:
        entry = Entry(every_s, fn, args, self)
        self.repeating.append(entry)
        return entry

    def cancel(self, entry: Any) -> None:
        """Drop ``entry`` (by identity: two entries may be equal); a gone one is no error."""
        for entries in (self.entries, self.repeating):
            for i, kept in enumerate(entries):
                if kept is entry:
                    del entries[i]
                    return

    def run(self) -> None:
        """Fire the entries in order, the ones they add too, until none is left."""
        while self.entries:
            entry = self.entries.pop(0)
            entry.fn(*entry.args)


class Qos:
    """A consumer's prefetch as the service moves it: ``value`` is the net change."""

    def __init__(self) -> None:
        self.value = 0

    def increment_eventually(self) -> None:
        self.value += 1

    def decrement_eventually(self) -> None:
        self.value -= 1


def make_service(
    store: MemoryStore, in_pool: list[str], *, clock: Clock | None = None
) -> IntervalService:
    """A service for bucket api on ``store``; its timer runs on ``clock`` (by default the
    MemoryStore's own, when a test injected one)."""
    if clock is None and isinstance(getattr(store, "_clock_us", None), Clock):
        clock = store._clock_us  # type: ignore[assignment]
    app = Celery("svc", set_as_current=False)
    app.conf.interval_store_url = "memory://"
    app.conf.interval_queues = {"api": INTERVAL_US / 1e6}
    return IntervalService(
        settings_of(app),
        store,
        Timer(clock),
        "w1@test",
        pool_slots=lambda: POOL_PROCESSES - len(in_pool),
        stop_queue=lambda queue: None,
        resume_queue=lambda queue: None,
        qos=Qos,
    )


def held_copy(service: IntervalService, task_id: str, started: list[str]) -> Held:
    return Held(
        request=Request(task_id),
        bucket="api",
        task_id=task_id,
        retries=0,
        queue="api",
        interval_us=INTERVAL_US,
        not_before_in_us=0,
        holder=service.new_holder(),
        acks_late=False,
        release=lambda req: started.append(req.id),
    )


def fire_soonest(timer: Timer, clock: Clock, entries: list[Entry]) -> None:
    """Fire the soonest of ``entries``, moving the store clock to when it is due (on a timer
    without a clock: on by its delay)."""
    entry = min(entries, key=lambda e: e.due_us)
    timer.entries.remove(entry)
    if timer.clock is None:
        clock.now_us += entry.due_us
    else:
        clock.now_us = max(clock.now_us, entry.due_us)
    entry[1](*entry[2])


def fire_due(timer: Timer, clock: Clock, within_s: float) -> None:
    """Fire timer entries due within ``within_s``, soonest first, moving the store clock."""
    until_us = (clock.now_us if timer.clock is not None else 0) + round(within_s * 1e6)
    while due := [e for e in timer.entries if e.due_us < until_us]:
        fire_soonest(timer, clock, due)


def run_until(timer: Timer, clock: Clock, done: Any, *, steps: int = 1_000) -> None:
    """Fire the timer's entries, soonest first, moving the store clock, until ``done()``."""
    for _ in range(steps):
        if done() or not timer.entries:
            return
        fire_soonest(timer, clock, timer.entries)
