"""Every store operation workers and operators use, run once on a Redis store (a secured one,
a cluster, a Sentinel group, a fenced one) with every answer checked."""

from __future__ import annotations

import time
from typing import Any

from celery_interval.config.table import KEY_PREFIX
from celery_interval.schedule import ClaimTerms, Outcome, Pace
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.overflow import overflow_index_for
from celery_interval.stores.redis import RedisStore

INTERVAL_US = 20_000
LEASE_US = 30_000_000
DEDUPE_US = 3_600_000_000


def exercise(store: Any, bucket: str = "api") -> None:
    """Every store operation workers and operators use, once each, every answer checked."""
    assert isinstance(store, RedisStore)
    store.ping()  # what worker start-up does
    first = store.grant(TaskCopy(bucket, "t1", 0), Pace(INTERVAL_US))
    second = store.grant(TaskCopy(bucket, "t2", 0), Pace(INTERVAL_US))
    assert (first.outcome, first.ticket, second.ticket) == (Outcome.OK, 1, 2)
    assert second.slot_us - first.slot_us == INTERVAL_US
    time.sleep(first.delay_us / 1e6 + 0.005)  # the margin covers store-clock vs. sleep drift
    claim = store.claim(
        TaskCopy(bucket, "t1", 0), INTERVAL_US, first.slot, ClaimTerms("h1", LEASE_US), ticket=1
    )
    assert claim.outcome is Outcome.OK
    assert store.renew(bucket, "t1", 0, "h1", LEASE_US)
    store.done([TaskCopy(bucket, "t1", 0)], DEDUPE_US)
    assert store.grant(TaskCopy(bucket, "t1", 0), Pace(INTERVAL_US)).outcome is Outcome.DUPLICATE
    assert store.pause(bucket, INTERVAL_US).paused
    held = store.claim(
        TaskCopy(bucket, "t2", 0), INTERVAL_US, second.slot, ClaimTerms("h1", LEASE_US), ticket=2
    )
    assert held.outcome is Outcome.PAUSED
    assert not store.unpause(bucket, INTERVAL_US).paused
    assert store.set_interval(bucket, INTERVAL_US, 2 * INTERVAL_US).interval_us == 2 * INTERVAL_US
    status = store.status(bucket, INTERVAL_US)
    assert (status.exists, status.ticket, status.overridden) == (True, 2, True)
    unset = store.unset_interval(bucket, INTERVAL_US)
    assert unset.dropped and (unset.status.interval_us, unset.status.ticket) == (INTERVAL_US, 2)
    running = TaskCopy(bucket, "t9", 0)  # a capped body takes its place back, then ends
    assert store.renew_place(running, LEASE_US, cap=1)
    assert store.status(bucket, INTERVAL_US).running == 1
    assert store.release(running)
    ops = [fields["op"] for _, fields in store.ledger(bucket)]
    assert ops[:3] == ["grant:OK", "grant:OK", "claim:OK"]
    assert ops[-2:] == ["set_interval", "unset_interval"]
    store.reset(bucket)
    assert not store.status(bucket, INTERVAL_US).exists
    index = overflow_index_for(store, KEY_PREFIX)
    assert index is not None
    index.park([(bucket, f"{bucket}:t")])
    (parking,) = index.due(10)
    assert index.changes(bucket, f"{bucket}:t") == parking.changes == 1
    index.defer(bucket, f"{bucket}:t", 0)
    assert index.size() == 1
    index.hold([(bucket, f"{bucket}:t")], 60_000_000)  # tasks taken back are unacked
    assert not index.drop_if(bucket, f"{bucket}:t", parking.changes), "dropped while held"
    assert index.size() == 1 and not index.due(10), "due when the hold ends"
    index.hold([(bucket, f"{bucket}:t")], 0)  # a shorter hold does not shorten it
    assert not index.drop_if(bucket, f"{bucket}:t", parking.changes)
    store.client().hdel(f"{KEY_PREFIX}{{~overflow}}:holds", f"{bucket}\n{bucket}:t")
    assert index.drop_if(bucket, f"{bucket}:t", parking.changes)
