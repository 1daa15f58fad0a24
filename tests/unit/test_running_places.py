"""A worker's running places: renewed while bodies run, released at their end, dropped."""

from __future__ import annotations

from celery import Celery

from celery_interval.config import settings_of
from celery_interval.schedule import ClaimTerms, Outcome, Pace
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.memory import MemoryStore
from celery_interval.worker.outage import StoreOutage
from celery_interval.worker.places import RunningPlaces
from tests.unit.test_service import Timer

LEASE_S = 3.0


class Clock:
    def __init__(self) -> None:
        self.now_us = 10**12

    def __call__(self) -> int:
        return self.now_us


def setup() -> tuple[Clock, MemoryStore, Timer, RunningPlaces]:
    app = Celery("places", set_as_current=False)
    app.conf.update(
        interval_store_url="memory://", interval_queues={"api": 0.001}, interval_lease_s=LEASE_S
    )
    clock = Clock()
    store = MemoryStore(clock_us=clock)
    timer = Timer()
    places = RunningPlaces(settings_of(app), store, timer, StoreOutage(1.0, lambda: 0))
    return clock, store, timer, places


def start(store: MemoryStore, clock: Clock, copy: TaskCopy) -> Outcome:
    g = store.grant(copy, Pace(1_000))
    clock.now_us += g.delay_us
    return store.claim(copy, 1_000, g.slot, ClaimTerms("h", 3_000_000, cap=1)).outcome


def test_a_running_body_keeps_its_place_and_frees_it_when_it_ends() -> None:
    clock, store, timer, places = setup()
    a, b = TaskCopy("api", "a", 0), TaskCopy("api", "b", 0)
    assert start(store, clock, a) is Outcome.OK
    request = object()
    places.hold(request, a)
    for _ in range(5):  # 5 s of body: renewed every second, never lapses
        delay_s, fn, _args = timer.entries.pop()
        assert delay_s == LEASE_S / 3
        clock.now_us += 1_000_000
        fn()
        assert start(store, clock, b) is Outcome.FULL
    places.free(request)
    assert start(store, clock, b) is Outcome.OK
    assert not places.running


def test_a_dropped_place_is_no_longer_renewed_and_comes_back_when_it_expires() -> None:
    clock, store, timer, places = setup()
    a, b = TaskCopy("api", "a", 0), TaskCopy("api", "b", 0)
    assert start(store, clock, a) is Outcome.OK
    request = object()
    places.hold(request, a)
    places.drop(request)
    _delay_s, fn, _args = timer.entries.pop()
    fn()
    assert not timer.entries
    clock.now_us += round(LEASE_S * 1e6)
    assert start(store, clock, b) is Outcome.OK
