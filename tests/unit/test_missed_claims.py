"""The ledger's ``missed=1``: a claim of the holder's own lease answered other than OK."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_interval.schedule import ClaimTerms, Outcome, Pace, Slot
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.redis import RedisStore
from tests.helpers.fakeclock import Clock

INTERVAL_US = 100_000
LEASE_US = 30_000_000


@pytest.fixture
def clocked(redis_client: redis.Redis[Any]) -> Iterator[tuple[RedisStore, Clock]]:
    """A Redis store on an injected clock."""
    clock = Clock(1_790_000_000_000_000)
    store = RedisStore(redis_client, now_us=clock)
    yield store, clock
    store.close()


def last_claim(store: RedisStore) -> dict[str, str]:
    """The ledger's latest claim entry."""
    return [f for _, f in store.ledger("api") if f["op"].startswith("claim:")][-1]


def test_a_paused_claim_past_the_holders_start_is_marked_missed(
    clocked: tuple[RedisStore, Clock],
) -> None:
    """Paused, the holder of the lease is told PAUSED with missed=1 (its start has not
    happened), another holder without it. Unpaused, the holder's start is still ahead (the
    pause stopped the bucket's time): OK again, its run, no mark."""
    store, clock = clocked
    a = TaskCopy("api", "a", 0)
    granted = store.grant(a, Pace(INTERVAL_US))
    clock.now_us += granted.delay_us
    slot = Slot(granted.epoch, granted.slot_us)
    assert store.claim(a, INTERVAL_US, slot, ClaimTerms("w1", LEASE_US)).outcome is Outcome.OK
    store.pause("api", INTERVAL_US)
    clock.now_us += 1_000
    assert store.claim(a, INTERVAL_US, slot, ClaimTerms("w1", LEASE_US)).outcome is Outcome.PAUSED
    assert (last_claim(store)["holder"], last_claim(store).get("missed")) == ("w1", "1")
    assert store.claim(a, INTERVAL_US, slot, ClaimTerms("w2", LEASE_US)).outcome is Outcome.PAUSED
    assert "missed" not in last_claim(store)  # not w2's lease
    store.unpause("api", INTERVAL_US)
    assert store.claim(a, INTERVAL_US, slot, ClaimTerms("w1", LEASE_US)).outcome is Outcome.OK
    entry = last_claim(store)
    assert (entry.get("again"), entry.get("missed")) == ("1", None)


def test_a_readmit_that_must_wait_is_marked_missed(clocked: tuple[RedisStore, Clock]) -> None:
    """The holder's start passed and another start was admitted since: its new start comes an
    interval after that one, a WAIT marked missed=1."""
    store, clock = clocked
    a, b = TaskCopy("api", "a", 0), TaskCopy("api", "b", 0)
    pace = Pace(INTERVAL_US)
    granted_a, granted_b = store.grant(a, pace), store.grant(b, pace)
    slot_a = Slot(granted_a.epoch, granted_a.slot_us)
    slot_b = Slot(granted_b.epoch, granted_b.slot_us)
    clock.now_us += granted_a.delay_us
    assert store.claim(a, INTERVAL_US, slot_a, ClaimTerms("w1", LEASE_US)).outcome is Outcome.OK
    clock.now_us += granted_b.delay_us - granted_a.delay_us
    assert store.claim(b, INTERVAL_US, slot_b, ClaimTerms("w2", LEASE_US)).outcome is Outcome.OK
    clock.now_us += 1_000
    again = store.claim(a, INTERVAL_US, slot_a, ClaimTerms("w1", LEASE_US))
    assert (again.outcome, again.delay_us) == (Outcome.WAIT, INTERVAL_US - 1_000)
    assert (last_claim(store)["holder"], last_claim(store).get("missed")) == ("w1", "1")
