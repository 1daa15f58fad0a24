"""Celery's task semantics on IntervalTask and on plain Task side by side, on real workers.

Each test runs one semantic on ``compat.i.*`` (IntervalTask, interval queue) and on
``compat.p.*`` (plain Task, plain queue) and asserts the two behave alike; the module ends by
checking that every interval start was spaced by the interval on the store's clock.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import chain, chord, group
from celery.exceptions import TimeLimitExceeded

from celery_interval.demo.embedded import RedisProc
from tests.helpers.compat import INTERVAL_S, compat_pool, starts
from tests.helpers.events import receiving
from tests.helpers.ledgers import happened_us
from tests.helpers.pool import Pool

pytestmark = pytest.mark.slow

TIMEOUT_S = 30.0


@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def compat(request: Any, redis_server: RedisProc, tmp_path_factory: Any) -> Iterator[Pool]:
    """Two prefork workers (-c 2) consuming the interval queue and the plain queue, on a Redis
    or a RabbitMQ broker (results and the store on the private Redis)."""
    from tests.helpers.brokers import rabbitmq_url

    broker = rabbitmq_url() if request.param == "rabbitmq" else ""
    pool = compat_pool(redis_server, tmp_path_factory.mktemp("compat"), broker=broker)
    try:
        pool.start(2, concurrency=2)
        yield pool
    finally:
        pool.stop()


def task(pool: Pool, kind: str, name: str) -> Any:
    return pool.app.tasks[f"compat.{kind}.{name}"]


def side_by_side(scenario: Callable[[str], Any]) -> Any:
    """Run ``scenario`` on IntervalTask, then on plain Task; both must observe the same."""
    interval, plain = scenario("i"), scenario("p")
    assert interval == plain, f"IntervalTask saw {interval!r}, plain Task saw {plain!r}"
    return plain


def wait_for(predicate: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.05)


def runs(pool: Pool, task_id: str) -> int:
    return len(starts(pool, task_id))


def test_replace_and_a_chain_with_a_replaced_link(compat: Pool) -> None:
    def scenario(kind: str) -> Any:
        replaced = task(compat, kind, "replaced")
        add = task(compat, kind, "add")
        one = replaced.delay(1).get(timeout=TIMEOUT_S)
        linked = chain(replaced.s(2), add.s(5)).delay().get(timeout=TIMEOUT_S)
        return one, linked

    assert side_by_side(scenario) == (101, 107)


@pytest.mark.parametrize("requeue", [True, False])
def test_reject(compat: Pool, requeue: bool) -> None:
    def scenario(kind: str) -> Any:
        result = task(compat, kind, "reject_once").delay(requeue)
        if requeue:
            return result.get(timeout=TIMEOUT_S), runs(compat, result.id)
        wait_for(lambda: runs(compat, result.id) >= 1)
        time.sleep(1.0)  # a second run would come within this
        return result.state, runs(compat, result.id)

    outcome = side_by_side(scenario)
    assert outcome == (("second", 2) if requeue else ("FAILURE", 1))


def test_retry_autoretry_backoff_and_max_retries(compat: Pool) -> None:
    def scenario(kind: str) -> Any:
        flaky = task(compat, kind, "flaky").delay(2)
        auto = task(compat, kind, "autoretry").delay(2)
        exhaust = task(compat, kind, "exhaust").delay()
        with pytest.raises(ValueError, match="always"):
            exhaust.get(timeout=TIMEOUT_S)
        got = flaky.get(timeout=TIMEOUT_S), auto.get(timeout=TIMEOUT_S)
        retries = [sorted(e["retries"] for e in starts(compat, r.id)) for r in (flaky, auto)]
        return got, retries, runs(compat, exhaust.id)

    assert side_by_side(scenario) == ((2, 2), [[0, 1, 2], [0, 1, 2]], 2)


def test_countdown_eta_and_expires(compat: Pool) -> None:
    def scenario(kind: str) -> Any:
        add = task(compat, kind, "add")
        sent_us = compat.store_now_us()
        countdown = add.apply_async((1, 1), countdown=1.0)
        eta = add.apply_async((2, 2), eta=datetime.now(timezone.utc) + timedelta(seconds=1))
        expired = add.apply_async((3, 3), countdown=2.0, expires=1.0)
        late_expired = add.apply_async((4, 4), expires=datetime.now(timezone.utc))
        got = countdown.get(timeout=TIMEOUT_S), eta.get(timeout=TIMEOUT_S)
        waited = [starts(compat, r.id)[0]["us"] - sent_us >= 1_000_000 for r in (countdown, eta)]
        wait_for(lambda: expired.state == "REVOKED" and late_expired.state == "REVOKED")
        return got, waited, runs(compat, expired.id) + runs(compat, late_expired.id)

    assert side_by_side(scenario) == ((2, 4), [True, True], 0)


def test_soft_and_hard_time_limits(compat: Pool) -> None:
    def scenario(kind: str) -> Any:
        soft = task(compat, kind, "sleepy").delay(3.0).get(timeout=TIMEOUT_S)
        hard = task(compat, kind, "hard_limited").delay()
        with pytest.raises(TimeLimitExceeded):
            hard.get(timeout=TIMEOUT_S)
        after = task(compat, kind, "add").delay(1, 2).get(timeout=TIMEOUT_S)  # pool replaced
        return soft, hard.state, after

    assert side_by_side(scenario) == ("soft", "FAILURE", 3)


def test_acks_late_with_reject_on_worker_lost(compat: Pool) -> None:
    def scenario(kind: str) -> Any:
        result = task(compat, kind, "die_once").delay()
        return result.get(timeout=TIMEOUT_S), runs(compat, result.id)

    assert side_by_side(scenario) == ("survived", 2)


def test_ignore_result_and_track_started(compat: Pool) -> None:
    def scenario(kind: str) -> Any:
        quiet = task(compat, kind, "quiet").delay()
        slow = task(compat, kind, "slow").delay(1.5)
        states = set()
        deadline = time.monotonic() + TIMEOUT_S
        while not slow.ready() and time.monotonic() < deadline:
            states.add(slow.state)
            time.sleep(0.02)
        wait_for(lambda: runs(compat, quiet.id) == 1)
        return quiet.state, "STARTED" in states, slow.get(timeout=TIMEOUT_S)

    assert side_by_side(scenario) == ("PENDING", True, 1.5)


def test_revoke_waiting_and_terminate_running(compat: Pool) -> None:
    def scenario(kind: str) -> Any:
        waiting = task(compat, kind, "add").apply_async((1, 1), countdown=1.5)
        running = task(compat, kind, "slow").delay(8.0)
        wait_for(lambda: runs(compat, running.id) == 1)
        waiting.revoke()
        running.revoke(terminate=True)
        wait_for(lambda: waiting.state == "REVOKED" and running.state == "REVOKED")
        time.sleep(2.0)  # the countdown passes: a revoked task must still not run
        return runs(compat, waiting.id), runs(compat, running.id), running.state

    assert side_by_side(scenario) == (0, 1, "REVOKED")


def test_canvas_chain_group_chord_chunks_starmap(compat: Pool) -> None:
    def scenario(kind: str) -> Any:
        add, tsum = task(compat, kind, "add"), task(compat, kind, "tsum")
        return (
            chain(add.s(1, 2), add.s(3), add.s(4)).delay().get(timeout=TIMEOUT_S),
            group(add.s(i, i) for i in range(4)).delay().get(timeout=TIMEOUT_S),
            chord((add.s(i, 1) for i in range(4)), tsum.s()).delay().get(timeout=TIMEOUT_S),
            add.chunks(zip(range(4), range(4)), 2).group().delay().get(timeout=TIMEOUT_S),
            add.starmap([(1, 2), (3, 4)]).delay().get(timeout=TIMEOUT_S),
        )

    assert side_by_side(scenario) == (10, [0, 2, 4, 6], 10, [[0, 2], [4, 6]], [3, 7])


def test_shared_task_and_apply_and_eager(compat: Pool) -> None:
    def scenario(kind: str) -> Any:
        shared = compat.app.tasks[f"compat.{kind}.shared"].delay(21).get(timeout=TIMEOUT_S)
        applied = task(compat, kind, "add").apply((2, 3)).get()
        compat.app.conf.task_always_eager = True
        try:
            eager = task(compat, kind, "add").delay(4, 5).get()
        finally:
            compat.app.conf.task_always_eager = False
        return shared, applied, eager

    assert side_by_side(scenario) == (42, 5, 9)


def priority_order(compat: Pool, kind: str, *, held_back: bool = False) -> list[str]:
    """With every process busy, 8 low- then 4 high-priority tasks; their labels in start order.
    ``held_back``: the workers stop consuming the queue while the 12 are sent and until every
    process is free again, so all of them wait in the broker, however slowly a loaded machine
    sends."""
    redis_broker = compat.broker.startswith("redis")
    high, low = (0, 9) if redis_broker else (9, 0)  # kombu's Redis transport: 0 is highest
    # Plain blockers: a prefetch of one per process spreads them two and two, so every process
    # is busy (interval workers hold what they receive).
    slow = task(compat, "p", "slow")
    blockers = [slow.apply_async((1.5,), priority=high) for _ in range(4)]
    wait_for(lambda: all(runs(compat, b.id) for b in blockers))
    prio = task(compat, kind, "prio")
    queue = compat.queue if kind == "i" else f"{compat.queue}-plain"  # compatapp's task_routes
    if held_back:
        replies = compat.app.control.cancel_consumer(queue, reply=True, timeout=5)
        assert len(replies) == len(compat.workers), replies
    lows = [prio.apply_async((f"low{i}",), priority=low) for i in range(8)]
    highs = [prio.apply_async((f"high{i}",), priority=high) for i in range(4)]
    if held_back:
        # RabbitMQ counts a prefetch per consumer: a worker consuming again while its processes
        # still run blockers would take two tasks it cannot start, behind them.
        for blocker in blockers:
            blocker.get(timeout=TIMEOUT_S)
        replies = compat.app.control.add_consumer(queue, reply=True, timeout=5)
        assert len(replies) == len(compat.workers), replies
    for result in lows + highs:
        result.get(timeout=TIMEOUT_S)
    sent = {r.id for r in lows + highs}
    return [e["label"] for e in sorted(starts(compat), key=lambda e: e["us"]) if e["id"] in sent]


def test_priority(compat: Pool) -> None:
    """Plain tasks: the waiting tasks start highest priority first (acks_late and a prefetch of
    one, as Celery's docs advise for priorities, make a plain worker hold few)."""
    order = priority_order(compat, "p", held_back=True)
    last_high = max(order.index(f"high{i}") for i in range(4))
    assert last_high < len(order) - 4, f"high-priority tasks ran after most low ones: {order}"


@pytest.mark.open_defect
def test_priority_of_interval_tasks(compat: Pool) -> None:
    """Open defect (the Celery features page): interval tasks should start highest priority
    first too; a worker takes a ticket for each task as it arrives while a process is free, so
    a low-priority task received first can start before a higher one received a moment later
    (seen: ['high0', 'low1', 'high2', ...] on one worker)."""
    order = priority_order(compat, "i")
    last_high = max(order.index(f"high{i}") for i in range(4))
    assert last_high < len(order) - 4, f"high-priority tasks ran after most low ones: {order}"


def test_task_received_events(compat: Pool) -> None:
    """Workers started with task events on (``worker_send_task_events``) announce each task as
    it arrives, with its name and arguments, as Flower and other event consumers expect."""
    with receiving(compat) as seen:

        def scenario(kind: str) -> Any:
            result = task(compat, kind, "add").delay(20, 22)
            assert result.get(timeout=TIMEOUT_S) == 42
            received = lambda: [  # noqa: E731
                e for e in list(seen) if e["type"] == "task-received" and e["uuid"] == result.id
            ]
            wait_for(lambda: bool(received()), timeout_s=5.0)
            event = received()[0]
            return event["args"], event["retries"], event["name"].split(".", 2)[2]

        assert side_by_side(scenario) == ("(20, 22)", 0, "add")


def test_a_task_id_sent_again_runs_again(compat: Pool) -> None:
    """Celery runs a task id sent twice twice (a signature applied again, as a chord's errback
    is); only a redelivered copy of one send is a duplicate."""
    import uuid

    def scenario(kind: str) -> Any:
        add = task(compat, kind, "add")
        task_id = f"again-{uuid.uuid4()}"
        assert add.apply_async((1, 1), task_id=task_id).get(timeout=TIMEOUT_S) == 2
        add.apply_async((2, 2), task_id=task_id)
        wait_for(lambda: runs(compat, task_id) >= 2)
        time.sleep(0.5)  # a third run would come within this
        return runs(compat, task_id)

    assert side_by_side(scenario) == 2


def test_zz_every_interval_start_was_spaced(compat: Pool) -> None:
    """Last in the module: all of the above, on the store's clock, kept the interval, and no
    body began before the start its worker handed it (a body may begin late on a loaded
    machine; one close to the next is then not the limit's doing)."""

    claims = happened_us(compat.recorder, compat.queue)
    interval_us = round(INTERVAL_S * 1e6)
    assert len(claims) > 20
    assert min(b - a for a, b in itertools.pairwise(claims)) >= interval_us
    # Eager and apply() calls run in the caller, chunks and starmap inline in one celery.*
    # message (no task id of their own): none of them is a start taken from the queue.
    bodies = sorted(
        (
            e
            for e in starts(compat)
            if e["name"].startswith("compat.i.") and not e["eager"] and e["id"] is not None
        ),
        key=lambda e: e["us"],
    )
    assert len(bodies) > 20
    unpaced = [e for e in bodies if e.get("dl") is None]
    assert not unpaced, f"interval bodies run without a start deadline: {unpaced[:3]}"
    early = [e for e in bodies if e["mono_ns"] < int(e["dl"])]
    assert not early, f"bodies began before their start: {early[:3]}"
