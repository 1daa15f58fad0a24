"""Faults injected for real: the store dies mid-run, loses every key, and comes back."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from test_pool import BODY_FLOOR_SHARE, assert_exactly_once, body_floor_us

from celery_interval.embedded import RedisProc

pytestmark = pytest.mark.slow

INTERVAL_S = 0.02


def test_store_outage_then_restart_with_every_key_lost(make_pool: Any, redis_server: Any) -> None:
    store = RedisProc()
    try:
        pool = make_pool(INTERVAL_S, store=store.url, record_url=redis_server.url_for(5))
        pool.recorder.delete(f"record:{pool.queue}")
        pool.start(3)
        ids = pool.send(150)
        pool.wait_records(40, timeout_s=60)
        store.kill()
        killed_at_ns = time.monotonic_ns()
        time.sleep(3.0)
        during = [r for r in pool.records() if r["mono_ns"] > killed_at_ns + 50_000_000]
        assert not during, f"{len(during)} tasks started while the store was down"
        store.restart()  # same port, empty: a new epoch
        records = pool.wait_records(150, timeout_s=120)
    finally:
        store.stop()
    assert_exactly_once(records, ids)
    deadlines = sorted(r["deadline_ns"] // 1000 for r in records)
    assert min(b - a for a, b in itertools.pairwise(deadlines)) >= body_floor_us(INTERVAL_S)
    starts = sorted(r["mono_ns"] // 1000 for r in records)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert sum(g < body_floor_us(INTERVAL_S) for g in gaps) <= (1 - BODY_FLOOR_SHARE) * len(gaps)
    for worker in pool.workers:
        log = worker.log()
        assert log.count("interval store unreachable") == 1, "one log line per outage"
        assert "interval store reachable again" in log
    assert any("the store lost its state (new epoch" in w.log() for w in pool.workers)


def test_sigkill_one_then_two_of_three_workers(make_pool: Any) -> None:
    """RabbitMQ returns a dead worker's unacked messages at once; a copy of a claimed one waits
    for its lease (3 s here) to expire, then runs; nothing is lost or started twice."""
    pool = make_pool(INTERVAL_S, conf={"interval_lease_s": 3.0})
    first, second, _ = pool.start(3)
    ids = pool.send(150)
    pool.wait_records(40, timeout_s=60)
    pool.kill(first)
    pool.wait_records(80, timeout_s=60)
    pool.kill(second)
    records = pool.wait_records(150, timeout_s=120)
    assert_exactly_once(records, ids)
    deadlines = sorted(r["deadline_ns"] // 1000 for r in records)
    assert min(b - a for a, b in itertools.pairwise(deadlines)) >= body_floor_us(INTERVAL_S)
