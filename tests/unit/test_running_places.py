"""A worker's running places: renewed while bodies run, released at their end, dropped."""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_interval.config import settings_of
from celery_interval.schedule import PLACE_SETTLE_US, ClaimTerms, Outcome, Pace
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.memory import MemoryStore
from celery_interval.worker.held import Held
from celery_interval.worker.store.outage import StoreOutage
from celery_interval.worker.store.places import RunningPlaces
from tests.helpers.fakeclock import Clock
from tests.helpers.fakes import Timer, fire_soonest, held_copy, make_service

LEASE_S = 3.0


def setup() -> tuple[Clock, MemoryStore, Timer, RunningPlaces]:
    app = Celery("places", set_as_current=False)
    app.conf.update(
        interval_store_url="memory://", interval_queues={"api": 0.001}, interval_lease_s=LEASE_S
    )
    clock = Clock(10**12)
    store = MemoryStore(clock_us=clock)
    store.grant(TaskCopy("warm", "w", 0), Pace(1_000))  # the store's birth, settled
    clock.now_us += PLACE_SETTLE_US
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
    places.hold(request, a, 1)
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
    places.hold(request, a, 1)
    places.drop(request)
    _delay_s, fn, _args = timer.entries.pop()
    fn()
    assert not timer.entries
    clock.now_us += round(LEASE_S * 1e6)
    assert start(store, clock, b) is Outcome.OK


def b_waits_for_as_place() -> tuple[MemoryStore, Any, list[str], Held, Held]:
    """Cap 1 on a worker with free processes: a starts, b waits for its place (FULL). Returns
    the store, the service, the started task ids, a and b."""
    clock = Clock(1_000_000_000)
    store = MemoryStore(clock)
    store.grant(TaskCopy("warm", "w", 0), Pace(1_000))  # the store's birth, settled
    clock.now_us += PLACE_SETTLE_US
    service = make_service(store, [])
    started: list[str] = []
    a, b = held_copy(service, "a", started), held_copy(service, "b", started)
    a.cap = b.cap = 1
    service.receive(a)
    service.receive(b)
    timer = service.timer
    while not service.slots._full.get("api"):  # fire the soonest entry until b finds it FULL
        fire_soonest(timer, clock, timer.entries)
    assert started == ["a"]
    return store, service, started, a, b


def test_a_body_ending_here_lets_the_task_waiting_for_its_place_claim_at_once() -> None:
    """Cap 1 on a worker with free processes: b waits (FULL); when a's body ends here its place
    is released and b claims in the same turn, not at its next look."""
    store, service, started, a, _b = b_waits_for_as_place()
    assert store.read_places("api")[0].holder == "a:0"
    service.body_ended(a.request)
    assert started == ["a", "b"]
    assert [p.holder for p in store.read_places("api")] == ["b:0"]


def test_a_place_freed_after_the_channel_closed_starts_nothing_that_went_back() -> None:
    """Cap 1: b waits for a's place (FULL), then the channel closes and b's message goes back
    to the broker. a's body ends after that: b must not start here (its message is another
    worker's now, and it would run twice once the store forgot its done mark)."""
    store, service, started, a, _b = b_waits_for_as_place()
    service.slots.pool.accepted("a")  # a runs in a pool process through the reconnect
    service.connection_lost()
    service.body_ended(a.request)
    assert started == ["a"]
    assert not store.read_places("api")
