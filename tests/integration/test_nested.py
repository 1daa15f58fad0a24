"""Tenant buckets inside one outer bucket on real workers: each keeps its own and the outer's."""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

import pytest

from celery_interval import control
from celery_interval.config import settings_of
from celery_interval.schedule import MAX_LEAD_US as ML_US
from celery_interval.starts import happened
from celery_interval.stores.redis import RedisStore
from tests.helpers.pool import Pool
from tests.helpers.pool_tasks import send_tenants

pytestmark = pytest.mark.slow

OUTER_S = 0.04  # the queue's bucket: 25 starts a second for all its tenants together
TENANT_S = 0.05  # each tenant's own bucket: 20 a second
TENANTS = ("acme", "globex", "initech")
EACH = 40


def _nested_pool(make_pool: Any) -> Pool:
    """A pool whose queue's tenant buckets (``workerapp.tenant``, TENANT_S) are nested in the
    queue's bucket (OUTER_S)."""
    queue = f"q{uuid.uuid4().hex[:10]}"
    pool: Pool = make_pool(
        OUTER_S,
        queue=queue,
        env_extra={"CI_TEST_TENANT_INTERVAL": str(TENANT_S)},
        conf={"interval_queues": {f"{queue}:*": {"outer": queue}}},
    )
    return pool


def test_three_tenants_inside_one_outer_bucket_keep_both_intervals_and_fill_the_outer(
    make_pool: Any,
) -> None:
    """Three tenants at 50 ms nested in their queue's bucket at 40 ms, a backlog of 40 tasks
    each, 2 workers x 3 processes: in the ledger (the store's clock) each tenant's starts are
    50 ms or more apart, all starts together 40 ms or more apart (how close to the outer's rate
    they run is how fast the machine wakes the workers: printed, not asserted)."""
    pool = _nested_pool(make_pool)
    pool.start(2, concurrency=3)
    calls = [(tenant, i) for i in range(EACH) for tenant in TENANTS]
    ids = send_tenants(pool, calls)
    pool.wait_records(len(ids), kind="tenant", timeout_s=120)
    store = RedisStore.from_url(pool.store, nesting=settings_of(pool.app).outer_of)
    starts: dict[str, dict[str, int]] = {}
    for tenant in TENANTS:
        entries = [f for _, f in store.ledger(f"{pool.queue}:{tenant}", count=10_000)]
        starts[tenant] = {f["task"]: int(f["start"]) for f in happened(entries)}
        own = sorted(int(f["start"]) for f in happened(entries))
        gaps_us = [b - a for a, b in itertools.pairwise(own)]
        assert min(gaps_us) >= TENANT_S * 1e6, (tenant, sorted(gaps_us)[:5])
    assert sorted(t for ran in starts.values() for t in ran) == sorted(ids), "every task started"
    everything = sorted(s for ran in starts.values() for s in ran.values())
    gaps_us = [b - a for a, b in itertools.pairwise(everything)]
    assert min(gaps_us) >= OUTER_S * 1e6, sorted(gaps_us)[:5]
    rate = (len(everything) - 1) / ((everything[-1] - everything[0]) / 1e6)
    print(f"{len(everything)} starts, {rate:.2f}/s of {1 / OUTER_S:.0f}/s; min gap {min(gaps_us)}")


def test_pausing_the_outer_bucket_pauses_every_tenant(make_pool: Any) -> None:
    """The outer bucket paused mid-run (``control.pause``): no tenant's start is admitted
    while it is paused (but for one admitted up to the lead before), every tenant starts again
    within half a second of the unpause, every task starts, all 40 ms apart."""
    pool = _nested_pool(make_pool)
    queue = pool.queue
    pool.start(2, concurrency=2)
    ids = send_tenants(pool, [(tenant, i) for i in range(20) for tenant in TENANTS])
    store = RedisStore.from_url(pool.store, nesting=settings_of(pool.app).outer_of)
    pool.wait_records(10, kind="tenant", timeout_s=60)
    control.pause(pool.app, queue)
    paused_at_us = pool.store_now_us()
    time.sleep(1.5)
    unpaused_at_us = pool.store_now_us()
    control.unpause(pool.app, queue)
    pool.wait_records(len(ids), kind="tenant", timeout_s=120)
    starts: dict[str, list[int]] = {}
    ran: set[str] = set()
    for tenant in TENANTS:
        entries = [f for _, f in store.ledger(f"{queue}:{tenant}", count=10_000)]
        starts[tenant] = sorted(int(f["start"]) for f in happened(entries))
        ran |= {f["task"] for f in happened(entries)}
    assert ran == set(ids), "every task started"
    everything = sorted(s for own in starts.values() for s in own)
    during = [s for s in everything if paused_at_us + ML_US < s < unpaused_at_us]
    assert not during, [s - paused_at_us for s in during]
    for tenant, own in starts.items():
        after = [s for s in own if s >= unpaused_at_us]
        assert after and after[0] - unpaused_at_us < 500_000, (tenant, after[:1])
    assert min(b - a for a, b in itertools.pairwise(everything)) >= OUTER_S * 1e6
