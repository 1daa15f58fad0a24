"""The store answers errors mid-run (out of memory, no write quorum), a task's bucket lookup
fails for a while: real workers hold their tasks, nothing is lost or run twice, one log line
as each starts and one as it ends."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
import redis

from celery_interval.demo.embedded import RedisProc
from tests.helpers.assertions import (
    assert_claims_spaced,
    assert_exactly_once,
    assert_one_ok_claim_each,
)
from tests.helpers.faults import publish
from tests.helpers.ledgers import happened_us, ledger_entries, run_starts_us
from tests.helpers.lookupapp import LOOKUP_DOWN

pytestmark = pytest.mark.slow

INTERVAL_S = 0.02
REFUSAL_S = 3.0


def logs_when_quiet(pool: Any, timeout_s: float = 10.0) -> dict[str, str]:
    """The workers' logs once each that logged a refusal logged its end (a worker logs the
    end once the store answered and no call failed for ``outage.QUIET_S``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        logs = {w.name: w.log() for w in pool.workers}
        pending = [
            name
            for name, log in logs.items()
            if log.count("interval store refusing calls")
            > log.count("interval store reachable again")
        ]
        if not pending or time.monotonic() > deadline:
            return logs
        time.sleep(0.2)


#: How each refusal is turned on and off. Out of memory refuses a script only at a first write
#: that could grow memory (Redis lets a script that has written go on), so whether the workers
#: meet it depends on which scripts run; a write quorum it cannot reach refuses every write.
REFUSALS = {
    "out_of_memory": (("maxmemory-policy", "noeviction"), ("maxmemory", "1"), ("maxmemory", "0")),
    "no_replicas": (
        ("min-replicas-max-lag", "10"),
        ("min-replicas-to-write", "1"),
        ("min-replicas-to-write", "0"),
    ),
}


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_a_store_refusing_writes_for_seconds_loses_nothing_and_runs_nothing_twice(
    make_pool: Any, redis_server: Any, refusal: str
) -> None:
    setup, refuse, clear = REFUSALS[refusal]
    store = RedisProc()
    admin: redis.Redis[Any] = redis.Redis.from_url(store.url)
    try:
        pool = make_pool(INTERVAL_S, store=store.url, record_url=redis_server.url_for(5))
        pool.recorder.delete(f"record:{pool.queue}")
        pool.start(3)
        ids = pool.send(150)
        pool.wait_records(40, timeout_s=60)
        admin.config_set(*setup)
        admin.config_set(*refuse)
        refused_from_ns = time.monotonic_ns()
        ids += pool.send(30)  # tasks that need tickets while the store refuses
        time.sleep(REFUSAL_S)
        admin.config_set(*clear)
        cleared_ns = time.monotonic_ns()
        records = pool.wait_records(len(ids), timeout_s=120)
        pool_logs = logs_when_quiet(pool)
        pool.recorder = admin  # the ledger is in the store
        assert_one_ok_claim_each(pool, ids)
        gaps_us = assert_claims_spaced(pool, INTERVAL_S)
    finally:
        admin.close()
        store.stop()
    assert_exactly_once(records, ids)
    publish(f"test_a_store_refusing_writes[{refusal}]", records, ids, gaps_us)
    late = [r for r in records if r["mono_ns"] > refused_from_ns]
    assert late, "every task ran before the store refused: the test proved nothing"
    during = sum(refused_from_ns < r["mono_ns"] < cleared_ns for r in records)
    refusing = {name: log.count("interval store refusing calls") for name, log in pool_logs.items()}
    cleared = {name: log.count("interval store reachable again") for name, log in pool_logs.items()}
    print(f"FIGURES {refusal}: {during} of {len(ids)} started in {REFUSAL_S}s, lines {refusing}")
    if refusal == "no_replicas":
        assert any(refusing.values()), "no worker met the refusal"
    assert all(n <= 1 for n in refusing.values()), f"one line as it starts: {refusing}"
    assert cleared == refusing, f"one line as it ends: {cleared} for {refusing}"
    for name, log in pool_logs.items():
        assert "Traceback" not in log, f"{name}: {log[-3000:]}"


def test_a_bucket_lookup_down_for_seconds_holds_its_tasks_then_each_runs_once(
    make_pool: Any,
) -> None:
    """The task's ``interval_bucket`` raises ConnectionError for 2 s: its messages wait in the
    worker (a threads pool's), none is failed or acked unrun; then each runs once, spaced."""
    pool = make_pool(INTERVAL_S, app_module="tests.helpers.lookupapp")
    pool.recorder.delete(f"record:{pool.queue}")
    down = LOOKUP_DOWN + pool.queue
    pool.recorder.set(down, 1, ex=120)
    try:
        (worker,) = pool.start(1, pool="threads", concurrency=2)
        ids = pool.send(20, task="storeerrors.looked_up")
        time.sleep(2.0)
        assert not pool.records(), "a task ran while its bucket could not be known"
    finally:
        pool.recorder.delete(down)
    records = pool.wait_records(20, timeout_s=60)
    assert_exactly_once(records, ids)
    runs_us = run_starts_us(pool.recorder, f"{pool.queue}:t1")
    claims = [
        {k: e.get(k) for k in ("op", "now", "task", "holder", "start", "readmit", "moved")}
        for e in ledger_entries(pool.recorder, f"{pool.queue}:t1")
        if e["op"].startswith("claim:")
    ]
    assert len(runs_us) == len(ids), ("one admitted start each, on the tenant's bucket", claims)
    starts_us = happened_us(pool.recorder, f"{pool.queue}:t1")
    gaps_us = [b - a for a, b in itertools.pairwise(starts_us)]
    assert min(gaps_us) >= INTERVAL_S * 1e6, f"{min(gaps_us)} us between starts"
    log = worker.log()
    assert log.count("waits for its placement") == 1, log[-3000:]
    assert "raised ConnectionError('tenant directory unreachable')" in log
    assert log.count("storeerrors.looked_up's placement works again") == 1, log[-3000:]
    assert "cannot be scheduled" not in log and "Traceback" not in log, log[-3000:]
