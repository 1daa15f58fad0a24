"""Drop-in on real workers: routing decides the bucket, revoked slots are used, replaced pool
processes keep the interval, every pool kind works, and nothing surprising happens silently."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import chain, group

from celery_interval.demo.embedded import RedisProc
from tests.helpers import compatapp
from tests.helpers.assertions import assert_body_gaps, assert_exactly_once, utilization
from tests.helpers.compat import compat_pool, starts
from tests.helpers.ledgers import bucket_claims, claim_times_us, ledger
from tests.helpers.pool import Pool, gaps_us

pytestmark = pytest.mark.slow

INTERVAL_S = 0.05
TIMEOUT_S = 60.0


def assert_paced(claims: list[tuple[int, str]], interval_s: float, count: int) -> None:
    """``count`` messages started in the bucket (each admitted start, re-admissions too, spaced)."""
    assert len({task_id for _, task_id in claims}) == count, claims
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(claims)]
    assert min(gaps) >= round(interval_s * 1e6), f"claims {gaps} closer than {interval_s}s"


@pytest.fixture(params=["redis", "rabbitmq"])
def routed(request: Any, redis_server: RedisProc, tmp_path: Any) -> Iterator[Pool]:
    """Two workers consuming every queue of ``compatapp.declared_queues``, on either broker."""
    from tests.helpers.brokers import rabbitmq_url

    broker = rabbitmq_url() if request.param == "rabbitmq" else ""
    pool = compat_pool(
        redis_server, tmp_path, broker=broker, conf={"compat_routing": True}, loglevel="INFO"
    )
    queues = ",".join(q.name for q in compatapp.declared_queues(pool.queue))
    try:
        pool.start(2, concurrency=2, queues=queues)
        yield pool
    finally:
        pool.stop()
        with pool.app.connection_for_write() as conn:
            for q in compatapp.declared_queues(pool.queue)[2:]:
                with contextlib.suppress(Exception):
                    q(conn.default_channel).delete()


def test_the_consumed_queue_decides_the_bucket(routed: Pool) -> None:
    pool, q = routed, routed.queue
    add = pool.app.tasks["compat.i.add"]
    plain_add = pool.app.tasks["compat.p.add"]
    to_slow = [add.apply_async((i, 0), queue=f"{q}-slow") for i in range(5)]
    # A producer declares what it publishes to (kombu's Redis transport routes by the type).
    topic_ex, fanout_ex = compatapp.exchanges(q)
    topic = [
        add.apply_async((i, 1), exchange=topic_ex, routing_key="events.created", declare=[topic_ex])
        for i in range(5)
    ]
    fanned = [
        add.apply_async((i, 2), exchange=fanout_ex, routing_key="fan", declare=[fanout_ex])
        for i in range(4)
    ]
    plain_on_interval = [plain_add.apply_async((i, 3), queue=q) for i in range(5)]
    for result in to_slow + topic + fanned + plain_on_interval:
        result.get(timeout=TIMEOUT_S)
    routes = compatapp.routing_queues(q, INTERVAL_S)
    assert_paced(bucket_claims(pool, f"{q}-slow"), routes[f"{q}-slow"], 5)
    assert_paced(bucket_claims(pool, f"{q}-events"), routes[f"{q}-events"], 5)
    # RabbitMQ gives each queue bound to a fanout exchange its copy; kombu's Redis transport
    # gives each subscribed worker one copy (on one of the queues). Each copy runs once,
    # paced by the queue it came from, as a plain task's copies run.
    fanned_ids = {r.id for r in fanned}
    deadline = time.monotonic() + TIMEOUT_S
    while len([e for e in starts(pool) if e["id"] in fanned_ids]) < 8:
        got = [(e["id"][:8], e["name"]) for e in starts(pool) if e["id"] in fanned_ids]
        assert time.monotonic() < deadline, f"a fanout copy did not run: {got}"
        time.sleep(0.1)
    time.sleep(1.0)  # a third copy would run within this
    assert len([e for e in starts(pool) if e["id"] in fanned_ids]) == 8
    per_queue = {name: bucket_claims(pool, name) for name in (f"{q}-fan1", f"{q}-fan2")}
    for name, claims in per_queue.items():
        if claims or "amqp" in pool.broker:
            assert_paced(claims, routes[name], 4 if "amqp" in pool.broker else 8)
    # The plain task on the interval queue went through the queue's own bucket.
    assert_paced(bucket_claims(pool, q), INTERVAL_S, 5)
    assert {t for _, t in bucket_claims(pool, q)} == {r.id for r in plain_on_interval}
    logs = "\n".join(w.log() for w in pool.workers)
    assert "plain task compat.p.add consumed from interval queue" in logs
    assert "compat.i.limited sets rate_limit='100/s'" in logs
    assert f"interval: queues {q}={INTERVAL_S:g}s" in logs and "channel_error_retry on" in logs


def test_revoked_and_expired_tasks_leave_no_empty_interval(make_pool: Any) -> None:
    pool = make_pool(INTERVAL_S, broker="redis")
    pool.start(3, concurrency=2)
    front = pool.send(40)
    with pool.app.producer_or_acquire() as producer:
        expiring = [
            pool.app.send_task(
                "workerapp.record", args=(100 + i,), expires=1.0, queue=pool.queue,
                producer=producer,
            ).id
            for i in range(10)
        ]  # fmt: skip
    back = pool.send(40)
    revoked = back[::2]
    for task_id in revoked:
        pool.app.control.revoke(task_id)
    kept = front + back[1::2]
    records = pool.wait_records(len(kept))
    assert_exactly_once(records, kept)
    used = utilization(records, INTERVAL_S)  # how soon the machine woke the workers too
    print(f"UTILIZATION {used:.3f} over {len(records)} starts, 20 revoked and 10 expired")
    # On the store's ledger, every ticket granted is claimed: a revoked or expired task's by
    # the next task its worker holds for the bucket (it hands the ticket on), a passed one's
    # with RETICKET. One per worker may find no task after it there (its slot stays empty).
    entries = ledger(pool)
    granted = {(e["epoch"], e["ticket"]) for e in entries if e["op"] == "grant:OK"}
    claimed = {
        (e["epoch"], e["ticket"]) for e in entries if e["op"] in ("claim:OK", "claim:RETICKET")
    }
    gone = {*revoked, *expiring}
    handed = {
        (e["epoch"], e["ticket"]) for e in entries if e["op"] == "grant:OK" and e["task"] in gone
    }
    empty = granted - claimed
    print(f"TICKETS {len(granted)}, of revoked or expired tasks {len(handed)}, {len(empty)} empty")
    assert len(empty) <= len(pool.workers), f"slots left empty: {sorted(empty)}"
    claims = claim_times_us(pool)
    assert min(b - a for a, b in itertools.pairwise(claims)) >= round(INTERVAL_S * 1e6)
    assert not {r["id"] for r in records} & {*revoked, *expiring}


@pytest.mark.parametrize(
    ("args", "mb"),
    [(("--max-tasks-per-child=1",), 0), (("--max-memory-per-child=20000",), 40),
     (("--autoscale=3,1",), 0)],
    ids=["max-tasks", "max-memory", "autoscale"],
)  # fmt: skip
def test_replaced_and_scaled_pool_processes_keep_the_interval(
    make_pool: Any, args: tuple[str, ...], mb: int
) -> None:
    interval_s = 0.1
    pool = make_pool(interval_s, broker="redis")
    pool.start(2, concurrency=2, args=args)
    ids = pool.send(30, task="workerapp.hog", mb=mb)
    records = pool.wait_records(30)
    assert_exactly_once(records, ids)
    print(f"GAPS min {min(gaps_us(records))}us")
    assert_body_gaps(pool, records, interval_s)
    claims = claim_times_us(pool)
    assert min(b - a for a, b in itertools.pairwise(claims)) >= round(interval_s * 1e6)


@pytest.mark.parametrize("pool_kind", ["threads", "solo", "gevent"])
def test_every_pool_kind_runs_canvas_and_keeps_the_interval(
    redis_server: RedisProc, tmp_path: Any, pool_kind: str
) -> None:
    pool = compat_pool(redis_server, tmp_path)
    try:
        pool.start(2, concurrency=1 if pool_kind == "solo" else 3, pool=pool_kind)
        add = pool.app.tasks["compat.i.add"]
        assert chain(add.s(1, 2), add.s(3)).delay().get(timeout=TIMEOUT_S) == 6
        assert group(add.s(i, i) for i in range(6)).delay().get(timeout=TIMEOUT_S) == [
            0, 2, 4, 6, 8, 10,
        ]  # fmt: skip
        results = [add.delay(i, 0) for i in range(12)]
        assert [r.get(timeout=TIMEOUT_S) for r in results] == list(range(12))
        claims = bucket_claims(pool, pool.queue)
        assert len({task_id for _, task_id in claims}) == 20
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(claims)]
        assert min(gaps) >= round(INTERVAL_S * 1e6)
    finally:
        pool.stop()
