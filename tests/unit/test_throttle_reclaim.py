"""P9 for a start admitted before a throttle and claimed again late, in every store kind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_interval.schedule import Backoff, ClaimTerms, Outcome, Pace, Slot
from celery_interval.stores.base import Store, TaskCopy
from celery_interval.stores.file import FileStore
from celery_interval.stores.memory import MemoryStore
from celery_interval.stores.redis import RedisStore
from tests.helpers.fakeclock import Clock

INTERVAL_US = 100_000
RETRY_AFTER_US = 1_000_000
LEASE_US = 30_000_000


@pytest.fixture(params=["memory", "file", "redis"])
def clocked(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, Clock]]:
    """A store of each kind on an injected clock (Redis: the private server's)."""
    clock = Clock(1_790_000_000_000_000)  # real µs
    if request.param == "memory":
        yield MemoryStore(clock_us=clock), clock
    elif request.param == "file":
        yield FileStore(tmp_path, clock_us=clock), clock
    else:
        client: redis.Redis[Any] = request.getfixturevalue("redis_client")
        store = RedisStore(client, now_us=clock)
        yield store, clock
        store.close()


def terms(holder: str) -> ClaimTerms:
    """A worker's claim terms: holder ``holder``, a long lease."""
    return ClaimTerms(holder, LEASE_US)


def test_a_start_admitted_before_a_throttle_and_claimed_again_late_waits_it_out(
    clocked: tuple[Store, Clock],
) -> None:
    """The soak's sequence: b's start is admitted, a (started before it) is throttled, then
    b's pool process comes late and claims again. b gets no start inside the throttle's wait:
    it waits until a has taken its kept slot, then starts one interval after it."""
    store, clock = clocked
    a, b = TaskCopy("api", "a", 0), TaskCopy("api", "b", 0)
    pace = Pace(INTERVAL_US)
    granted_a, granted_b = store.grant(a, pace), store.grant(b, pace)
    clock.now_us += granted_a.delay_us
    assert store.claim(a, INTERVAL_US, granted_a.slot, terms("w1")).outcome is Outcome.OK
    clock.now_us += granted_b.delay_us - granted_a.delay_us
    started_b = store.claim(b, INTERVAL_US, granted_b.slot, terms("w2"))
    assert (started_b.outcome, started_b.delay_us) == (Outcome.OK, 0)
    clock.now_us += 50_000
    throttled_us = clock.now_us
    store.throttle(a, INTERVAL_US, Backoff(RETRY_AFTER_US, granted_a.ticket))
    clock.now_us += 250_000  # b's pool process reaches it late: it claims again
    again = store.claim(b, INTERVAL_US, granted_b.slot, terms("w2"))
    assert again.outcome is Outcome.WAIT
    assert again.delay_us == throttled_us + RETRY_AFTER_US + INTERVAL_US - clock.now_us
    kept = store.grant(a, pace)  # the throttled copy sent again: its kept slot, first
    assert (kept.ticket, kept.delay_us) == (granted_a.ticket, RETRY_AFTER_US - 250_000)
    clock.now_us = throttled_us + RETRY_AFTER_US
    rerun = store.claim(a, INTERVAL_US, Slot(kept.epoch, kept.slot_us), terms("w3"))
    assert (rerun.outcome, rerun.delay_us) == (Outcome.OK, 0)
    assert store.claim(b, INTERVAL_US, granted_b.slot, terms("w2")).outcome is Outcome.WAIT
    clock.now_us += INTERVAL_US
    readmitted = store.claim(b, INTERVAL_US, granted_b.slot, terms("w2"))
    assert (readmitted.outcome, readmitted.delay_us) == (Outcome.OK, 0)
    held = store.claim(b, INTERVAL_US, granted_b.slot, terms("w1"))
    assert held.outcome is Outcome.HELD  # b runs once: under w2's lease
    if isinstance(store, RedisStore):
        starts = [
            (int(f["start"]), f.get("readmit"))
            for _, f in store.ledger("api")
            if f["op"] == "claim:OK"
        ]
        assert not [s for s, _ in starts if throttled_us <= s < throttled_us + RETRY_AFTER_US]
        assert starts[-1] == (clock.now_us, "1")
