"""A pool process that claims a new start claims it under the bucket's cap, as its worker did."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Ignore

from celery_interval.app_store import store_of
from celery_interval.schedule import PLACE_SETTLE_US, ClaimTerms, Outcome, Pace
from celery_interval.stores.base import ClaimArgs, TaskCopy
from celery_interval.stores.memory import MemoryStore
from celery_interval.worker.process import started
from tests.helpers.fakeclock import Clock

I_US = 20_000
LEASE_US = 3_000_000
CAP = 2
T0_US = 1_700_000_000_000_000


def _born(store: MemoryStore, clock: Clock) -> None:
    """The store's birth, and the settle after it (claims holding no place wait) passed."""
    store.grant(TaskCopy("other", "x", 0), Pace(I_US))
    clock.now_us += PLACE_SETTLE_US


def _started(store: MemoryStore, clock: Clock, task_id: str, holder: str) -> ClaimArgs:
    """A start of ``task_id`` under the cap, as a worker claims it; the args it hands its pool
    process (``Held.claim_args``)."""
    copy = TaskCopy("c", task_id, 0)
    grant = store.grant(copy, Pace(I_US))
    clock.now_us += max(0, grant.delay_us)
    args = ClaimArgs("c", task_id, 0, I_US, grant.epoch, grant.slot_us, holder, grant.ticket, 0)
    args = args._replace(cap=CAP)
    claimed = store.claim(copy, I_US, grant.slot, ClaimTerms(holder, LEASE_US, cap=CAP))
    assert claimed.outcome is Outcome.OK
    return args


def test_a_claim_again_keeps_the_running_body_s_place() -> None:
    """Two bodies hold the cap's places; the store is out while their pool processes claim
    again, so no renewal went. Their claims again renew their places: a third start is FULL
    once the places taken at the first claims expire (claims without the cap let it run)."""
    clock = Clock(T0_US)
    store = MemoryStore(clock_us=clock)
    _born(store, clock)
    running = [_started(store, clock, "a", "w1/1"), _started(store, clock, "b", "w2/1")]
    clock.now_us += LEASE_US - 100_000  # no renewal meanwhile (the store was out)
    for args in running:  # each a new start an interval after the last (``_claim_again``)
        again = args.claim(store, LEASE_US, 0)
        while again.outcome is Outcome.WAIT:
            clock.now_us += again.delay_us
            again = args.claim(store, LEASE_US, 0)
        assert again.outcome is Outcome.OK
    clock.now_us += 200_000  # the places of the first claims have expired
    third = TaskCopy("c", "third", 0)
    grant = store.grant(third, Pace(I_US))
    clock.now_us += max(0, grant.delay_us)
    claimed = store.claim(third, I_US, grant.slot, ClaimTerms("w3/1", LEASE_US, cap=CAP))
    assert claimed.outcome is Outcome.FULL, "a third body would run beside two"


def test_a_claim_again_that_finds_the_places_full_waits_for_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FULL is no reason to drop the body (``Ignore``): the pool process waits for a place."""
    app = Celery("again_cap", set_as_current=False)
    app.conf.update(interval_store_url="memory://", interval_queues={"c": I_US / 1e6})
    store = store_of(app)
    assert isinstance(store, MemoryStore)
    clock = Clock(0)
    monkeypatch.setattr(store, "_clock_us", clock)
    clock.now_us = T0_US
    _born(store, clock)
    a = _started(store, clock, "a", "w1/1")
    assert store.release(TaskCopy("c", "a", 0))  # a's place went with a store that lost it
    for other in ("b", "d"):
        _started(store, clock, other, f"{other}/1")
    result: list[Any] = []

    def claim_again() -> None:
        try:
            result.append(started._claim_again(app, a, 10_000_000, 3_000_000))
        except (Ignore, Exception) as exc:  # the test reports what it raised
            result.append(exc)

    thread = threading.Thread(target=claim_again, daemon=True)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive() and not result, f"did not wait for a place: {result}"
    assert store.release(TaskCopy("c", "b", 0))
    clock.now_us += 1_000_000  # past the interval after the last start
    thread.join(10)
    assert len(result) == 1 and isinstance(result[0], tuple), result
