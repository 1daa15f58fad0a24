"""Faults injected for real: the store dies mid-run, loses every key, and comes back."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from test_pool import BODY_FLOOR_SHARE, assert_exactly_once, body_floor_us

from celery_interval.embedded import RedisProc
from celery_interval.stores.keys import mark_key

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


def test_acks_late_task_killed_mid_body_runs_again(make_pool: Any) -> None:
    """The lease of a running acks_late task is renewed while it runs; killed mid-body, its
    redelivered copy waits out the lease (2 s here) and runs again, as Celery promises."""
    pool = make_pool(INTERVAL_S, conf={"interval_lease_s": 2.0})
    doomed, _ = pool.start(2, concurrency=1)
    ids = pool.send(6, task="workerapp.record_late", sleep_s=4.0)
    deadline = time.monotonic() + 30
    running: list[dict[str, Any]] = []
    while not running and time.monotonic() < deadline:
        running = [r for r in pool.records() if r["host"] == doomed.name]
        time.sleep(0.05)
    assert running, "the doomed worker never started a task"
    time.sleep(2.5)  # longer than the lease: only renewal keeps it live
    killed = running[0]["id"]
    lease = pool.recorder.get(mark_key("ci:", pool.queue, killed, 0)).decode().split("|")
    seconds, micros = pool.recorder.time()
    assert lease[0] == "L" and int(lease[3]) > seconds * 1_000_000 + micros, "lease not renewed"
    pool.kill(doomed)
    ends = pool.wait_records(6, kind="end", timeout_s=120)
    assert sorted(r["id"] for r in ends) == sorted(ids)
    starts = [r["id"] for r in pool.records() if r["kind"] == "start"]
    assert starts.count(killed) == 2, "the killed acks_late task runs again, once"
    assert all(starts.count(i) == 1 for i in ids if i != killed)
