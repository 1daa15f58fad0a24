"""One interval for a whole pool: real `celery worker` processes, real brokers, Redis store."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest

from celery_interval.schedule.state import MAX_LEAD_US
from tests.helpers.assertions import (
    assert_exactly_once,
    assert_spacing,
    assert_ticket_order,
    body_floor_us,
    utilization,
)
from tests.helpers.ledgers import claim_times_us
from tests.helpers.pool import Pool, celery_cli

pytestmark = pytest.mark.slow

INTERVAL_S = 0.02


@pytest.mark.parametrize(
    ("broker", "pool_type"),
    [("rabbitmq", "prefork"), ("redis", "prefork"), ("rabbitmq", "threads")],
)
def test_three_workers_hold_one_interval(make_pool: Any, broker: str, pool_type: str) -> None:
    pool = make_pool(INTERVAL_S, broker=broker)
    pool.start(3, concurrency=2, pool=pool_type)
    ids = pool.send(200)
    records = pool.wait_records(200)
    assert_exactly_once(records, ids)
    assert_spacing(pool, records, INTERVAL_S)
    assert_ticket_order(pool, records, INTERVAL_S)
    # How full the run was depends on how soon the machine wakes each worker: a figure for the
    # benchmarks (bench/pool.py), printed here.
    print(f"FIGURES utilization {utilization(records, INTERVAL_S):.3f}")
    assert len({r["host"] for r in records}) == 3, "every worker should take part"


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_without_parking_workers_stop_fetching_at_the_cap_and_resume(
    make_pool: Any, broker: str
) -> None:
    """Parking off, 4 tasks held per bucket at most: each worker stops consuming the queue at
    the cap and resumes at half, until every task ran once, spaced."""
    conf = {"interval_overflow": False, "interval_max_held": 4}
    pool = make_pool(INTERVAL_S, broker=broker, conf=conf, loglevel="INFO")
    pool.start(2, concurrency=2)
    ids = pool.send(80)
    records = pool.wait_records(80)
    assert_exactly_once(records, ids)
    assert_spacing(pool, records, INTERVAL_S)
    stops = [w.log().count("reached interval_max_held, pausing fetch") for w in pool.workers]
    assert any(stops), "no worker stopped at the cap: the test proved nothing"


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_pause_and_unpause_through_the_cli(make_pool: Any, broker: str) -> None:
    # A small hold cap leaves tasks in the broker for the worker that starts while paused.
    pool = make_pool(INTERVAL_S, broker=broker, conf={"interval_max_held": 10})
    pool.start(3)
    # Enough tasks that the run after the unpause lasts seconds: the late worker learns of the
    # parked tasks within a poll or two and must take part.
    ids = pool.send(200)
    pool.wait_records(20, timeout_s=30)
    # every worker's reply, also on a loaded machine (the command waits the whole timeout)
    paused = celery_cli(pool, "control", "pause_queue", pool.queue, "--timeout", "6")
    assert paused.returncode == 0, paused.stderr
    paused_at_us = pool.store_now_us()
    replies = [ln for ln in paused.stdout.splitlines() if ln.startswith("->")]
    assert len(replies) == 3, paused.stdout
    time.sleep(1.0)
    # A worker started while paused stays paused. It does not park (the others would take
    # back what it parks), so the tasks it holds at the unpause are its own to run.
    late_conf = json.dumps({**pool.conf, "interval_overflow": False})
    late = pool.start(1, CI_TEST_CONF=late_conf)[0]
    # Tasks sent now reach the late worker too (the others are at their hold cap): it holds
    # some while paused, so it must run them after the unpause, however late it started.
    ids += pool.send(20)
    _wait_until_it_holds(pool, late.name)
    unpaused_at_us = pool.store_now_us()
    # starts the store admitted during the pause (a body admitted before it may begin late)
    admitted = [us for us in claim_times_us(pool) if paused_at_us + MAX_LEAD_US < us]
    assert not [us for us in admitted if us <= unpaused_at_us], admitted[:3]
    resumed = celery_cli(pool, "control", "unpause_queue", pool.queue, "--timeout", "6")
    assert resumed.returncode == 0, resumed.stderr
    records = pool.wait_records(len(ids))
    assert_exactly_once(records, ids)
    assert_spacing(pool, records, INTERVAL_S)
    assert any(r["host"] == late.name for r in records), "the late worker never ran a task"


def _wait_until_it_holds(pool: Any, worker: str, timeout_s: float = 30.0) -> None:
    """Wait until ``worker`` holds a task of the pool's queue (``inspect interval_stats``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replies = pool.app.control.broadcast(
            "interval_stats",
            arguments={"buckets": [pool.queue]},
            destination=[worker],
            reply=True,
            limit=1,
            timeout=2,
        )
        if any(s.get(pool.queue, {}).get("held", 0) for r in replies for s in r.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"{worker} held no task {timeout_s}s after tasks were sent")


def test_unknown_queue_is_an_error_reply(make_pool: Any) -> None:
    pool = make_pool(INTERVAL_S)
    pool.start(1)
    result = celery_cli(pool, "control", "pause_queue", "nope", "--timeout", "2")
    assert "unknown interval bucket 'nope'" in result.stdout + result.stderr
    assert pool.queue in result.stdout + result.stderr


def test_set_interval_mid_run_for_the_whole_pool(make_pool: Any) -> None:
    """Set mid-run, the new interval spaces every later start of the pool; tasks sent after
    the command returned start under it, however long a loaded machine took to run it."""
    pool = make_pool(INTERVAL_S)
    pool.start(3)
    ids = pool.send(300)
    pool.wait_records(15, timeout_s=30)
    result = celery_cli(pool, "control", "set_interval", pool.queue, "0.05", "--timeout", "2")
    assert result.returncode == 0, result.stderr
    changed_at_us = pool.store_now_us()
    ids += pool.send(20)
    records = pool.wait_records(320)
    assert_exactly_once(records, ids)
    after = [t for t in claim_times_us(pool) if t > changed_at_us + 50_000]  # store clock
    assert len(after) > 10
    assert min(b - a for a, b in itertools.pairwise(after)) >= 50_000


def test_unset_interval_reaches_every_worker(make_pool: Any) -> None:
    """`celery control unset_interval`: each worker drops the override in the store (the first
    finds it, the others find none), the epoch stays, and starts go back to the configured
    spacing."""
    import celery_interval
    from celery_interval.config.table import KEY_PREFIX
    from celery_interval.stores.keys import ledger_key

    pool = make_pool(INTERVAL_S)
    pool.start(2)
    set_ = celery_cli(pool, "control", "set_interval", pool.queue, "0.05", "--timeout", "2")
    assert set_.returncode == 0, set_.stderr
    before = celery_interval.status(pool.app, pool.queue)
    assert (before.overridden, before.interval_us) == (True, 50_000)
    result = celery_cli(pool, "control", "unset_interval", pool.queue, "--timeout", "2")
    assert result.returncode == 0, result.stderr
    replies = [ln for ln in result.stdout.splitlines() if ln.startswith("->")]
    assert len(replies) == 2 and all(ln.endswith("OK") for ln in replies), result.stdout
    unset_at_us = pool.store_now_us()
    after = celery_interval.status(pool.app, pool.queue)
    assert (after.overridden, after.interval_us) == (False, round(INTERVAL_S * 1e6))
    assert after.epoch == before.epoch, "no new epoch"
    entries = pool.recorder.xrange(ledger_key(KEY_PREFIX, pool.queue))
    changed = [f[b"changed"] for _id, f in entries if f[b"op"] == b"unset_interval"]
    assert sorted(changed) == [b"0", b"1"], "one entry per worker, one of them dropped it"
    ids = pool.send(60)
    records = pool.wait_records(60)
    assert_exactly_once(records, ids)
    gaps = [b - a for a, b in itertools.pairwise(claim_times_us(pool)) if a > unset_at_us]
    assert len(gaps) >= 50
    assert 20_000 <= min(gaps) < 50_000, "the configured 20 ms spacing is back"


def test_revoke_retry_tenants_and_plain_tasks(make_pool: Any) -> None:
    pool = make_pool(INTERVAL_S, env_extra={"CI_TEST_TENANT_INTERVAL": "0.1"})
    pool.start(3)
    ids = pool.send(40)
    revoked = ids[30]
    pool.app.control.revoke(revoked)
    retried = pool.app.send_task(
        "workerapp.record", args=(1000,), kwargs={"fail_times": 2}, queue=pool.queue
    ).id
    with pool.app.producer_or_acquire() as producer:
        for i in range(10):
            for tenant in ("a", "b"):
                pool.app.send_task(
                    "workerapp.tenant", args=(tenant, i), queue=pool.queue, producer=producer
                )
    plain_sent_us = pool.store_now_us()
    pool.app.send_task("workerapp.plain", args=(0,), queue=f"{pool.queue}-plain")
    starts = pool.wait_records(39 + 3)
    assert revoked not in {r["id"] for r in starts}
    assert len([r for r in starts if r["id"] == retried]) == 3
    tries = claim_times_us(pool, task_id=retried, readmits=False)  # each try's start
    assert len(tries) == 3 and min(b - a for a, b in itertools.pairwise(tries)) >= 20_000
    assert len({r["ticket"] for r in starts if r["id"] == retried}) == 3, "each retry a new ticket"
    tenants = pool.wait_records(20, kind="tenant")
    for tenant in ("a", "b"):  # each its own bucket at 0.1 s: exact on the store's clock
        times = sorted(r["us"] for r in tenants if r["args"][0] == tenant)
        assert len(times) == 10
        claims = claim_times_us(pool, bucket=f"{pool.queue}:{tenant}")
        assert len(claims) >= 10 and min(b - a for a, b in itertools.pairwise(claims)) >= 100_000
        body_gap_us = min(b - a for a, b in itertools.pairwise(times))  # as the OS ran them
        print(f"TENANT {tenant}: body gaps {body_gap_us}us at least (floor {body_floor_us(0.1)})")
    plain = pool.wait_records(1, kind="plain")
    assert plain[0]["us"] - plain_sent_us < 500_000, "a plain task waited behind interval tasks"


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_busy_pools_keep_body_start_spacing(make_pool: Any, broker: str) -> None:
    pool = make_pool(INTERVAL_S, broker=broker)
    pool.start(3, concurrency=2)
    ids = pool.send(80, sleep_s=8 * INTERVAL_S)
    records = pool.wait_records(80)
    assert_exactly_once(records, ids)
    assert_spacing(pool, records, INTERVAL_S)


def test_a_worker_with_a_wrong_wall_clock(make_pool: Any, faketime_env: dict[str, str]) -> None:
    pool = make_pool(INTERVAL_S)
    pool.start(2)
    skewed = pool.start(1, **faketime_env)[0]
    ids = pool.send(100)
    records = pool.wait_records(100)
    assert_exactly_once(records, ids)
    assert_spacing(pool, records, INTERVAL_S, one_host_clock=False)
    assert any(r["host"] == skewed.name for r in records), "the skewed worker never ran a task"


#: The countdown of the ETA task: it must still be "eta" when the ``celery inspect`` process,
#: slow to start on a loaded machine, asks.
LATE_S = 6


def _held_ids(pool: Pool, worker: str) -> set[str]:
    """The ids of the tasks ``worker`` holds in the pool's bucket (``interval_stats``)."""
    replies = pool.app.control.broadcast(
        "interval_stats", reply=True, destination=[worker], limit=1, timeout=5
    )
    held = [r[worker].get(pool.queue, {}).get("held_tasks", []) for r in replies if worker in r]
    return {h["id"] for hs in held for h in hs}


def test_inspect_countdown_override_and_timeout_warning(make_pool: Any) -> None:
    """Held tasks show in `inspect interval_stats`, with a ticket for each free pool process and
    the rest queued; a countdown task takes its ticket when due and its slot is not before it;
    a per-call bucket override gets its own bucket; a too-long hold is warned about at start."""
    pool = make_pool(
        INTERVAL_S, broker="redis", conf={"interval_broker_timeout_s": 1.0}, loglevel="INFO"
    )
    worker = pool.start(1)[0]
    # 40 held tasks at 50 ms: the last waits 2 s (interval_hold_ahead_s)
    assert "may wait 2s, longer than the broker's redelivery timeout 1s" in worker.log()
    assert celery_cli(pool, "control", "pause_queue", pool.queue).returncode == 0
    sent_us = pool.store_now_us()
    ids = pool.send(3)
    late = pool.app.send_task("workerapp.record", args=(99,), countdown=LATE_S, queue=pool.queue).id
    vip = f"{pool.queue}:vip"  # a bucket of its own, with the queue's interval
    other = pool.app.send_task(
        "workerapp.record", args=(98,), queue=pool.queue, headers={"interval_bucket": vip}
    ).id
    deadline = time.monotonic() + 30
    while _held_ids(pool, worker.name) != {*ids, late}:  # every task has reached the worker
        assert time.monotonic() < deadline, _held_ids(pool, worker.name)
        time.sleep(0.1)
    stats = celery_cli(pool, "inspect", "interval_stats", "--json", "--timeout", "2")
    assert stats.returncode == 0, stats.stderr
    per_bucket = json.loads(stats.stdout)[worker.name]
    held = per_bucket[pool.queue]["held_tasks"]
    assert {h["id"] for h in held} == {*ids, late}
    by_held_id = {h["id"]: h for h in held}
    assert [by_held_id[i]["ticket"] for i in ids] == [1, 2, 0], held  # -c 2: two tickets
    assert (by_held_id[ids[2]]["state"], by_held_id[late]["state"]) == ("queued", "eta"), held
    assert per_bucket[pool.queue]["paused"] is True
    assert celery_cli(pool, "control", "unpause_queue", pool.queue).returncode == 0
    records = pool.wait_records(5)
    by_id = {r["id"]: r for r in records}
    assert by_id[late]["us"] - sent_us >= LATE_S * 1_000_000, "the countdown was not honoured"
    assert other in by_id and f"interval {vip}: task {other} ticket 1" in worker.log()
    assert f"interval {pool.queue}: task {ids[0]} ticket 1" in worker.log()


def test_a_busy_pool_claims_its_own_tickets_in_order(make_pool: Any) -> None:
    """One worker, one pool process, bodies 4x the interval: every task is due while the pool
    is busy. The worker claims them lowest ticket first, so it never passes its own tickets
    (a pass would re-ticket them to the tail)."""
    pool = make_pool(0.005)
    pool.start(1, concurrency=1)
    ids = pool.send(40, sleep_s=0.02)
    records = pool.wait_records(40)
    assert_exactly_once(records, ids)
    from celery_interval.config.table import KEY_PREFIX
    from celery_interval.stores.keys import ledger_key

    ops = [f[b"op"] for _id, f in pool.recorder.xrange(ledger_key(KEY_PREFIX, pool.queue))]
    assert ops.count(b"claim:RETICKET") == 0, f"{ops.count(b'claim:RETICKET')} re-tickets"
    tickets = [r["ticket"] for r in sorted(records, key=lambda r: r["mono_ns"])]
    assert tickets == sorted(tickets)
