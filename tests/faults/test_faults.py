"""Faults injected for real: workers, store and broker fail mid-run; nothing lost or doubled."""

from __future__ import annotations

import contextlib
import itertools
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_interval.config.table import KEY_PREFIX
from celery_interval.demo.embedded import RedisProc
from celery_interval.headers import BUCKET_HEADER, SEND_HEADER, SEND_ONCE
from celery_interval.stores.keys import mark_key
from tests.helpers.assertions import (
    assert_body_gaps,
    assert_claims_spaced,
    assert_deadlines,
    assert_exactly_once,
    assert_one_ok_claim_each,
    utilization,
)
from tests.helpers.brokerproc import RabbitNode
from tests.helpers.faults import (
    ADMITTED_BEFORE_NS,
    Kill,
    admitted_as_it_died,
    publish,
    redis_visibility,
    released_as_the_channel_closed,
)
from tests.helpers.latency import LatencyProxy
from tests.helpers.ledgers import ledger, ledger_entries
from tests.helpers.pool import Pool, Worker
from tests.helpers.popped import popped_as_killed, received_list

pytestmark = pytest.mark.slow

INTERVAL_S = 0.02


def deadline_gaps_us(records: list[dict[str, Any]]) -> list[int]:
    deadlines = sorted(r["deadline_ns"] // 1000 for r in records)
    return [b - a for a, b in itertools.pairwise(deadlines)]


def broadcast_to_all(pool: Pool, command: str) -> None:
    """``command`` for the pool's queue, returning once every worker replied (it applied it)."""
    replies = pool.app.control.broadcast(
        command,
        arguments={"queue": pool.queue},
        reply=True,
        limit=len(pool.workers),
        timeout=10.0,
    )
    assert len(replies) == len(pool.workers), replies


def assert_one_line_per_outage(pool: Pool, records: list[dict[str, Any]], since_ns: int) -> None:
    """One outage line and one recovery line from each worker that held tasks through the
    outage, at most one from the others. Every task was delivered before the outage, so a
    worker starting tasks after it held them through it (one whose consumer came up late may
    have received none, and never touches the store)."""
    held_through = {r["host"] for r in records if r["mono_ns"] > since_ns}
    assert held_through, "no worker held tasks through the outage"
    for worker in pool.workers:
        log = worker.log()
        outages = log.count("interval store unreachable")
        expected = {1} if worker.name in held_through else {0, 1}
        assert outages in expected, f"{worker.name}: {outages} outage lines, one per outage"
        assert log.count("interval store reachable again") == outages


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
        during = [r for r in pool.records() if r["deadline_ns"] > killed_at_ns + ADMITTED_BEFORE_NS]
        assert not during, f"{len(during)} tasks started while the store was down"
        store.restart()  # same port, empty: a new epoch
        records = pool.wait_records(150, timeout_s=120)
    finally:
        store.stop()
    assert_exactly_once(records, ids)
    deadline_gaps = deadline_gaps_us(records)
    publish("test_store_outage_then_restart_with_every_key_lost", records, ids, deadline_gaps)
    assert_body_gaps(pool, records, INTERVAL_S)
    assert_one_line_per_outage(pool, records, killed_at_ns)
    assert any(re.search(r"new epoch \d+ \(the store lost", w.log()) for w in pool.workers)


def test_a_copy_back_after_the_store_lost_its_state_is_dropped_where_it_ran(
    make_pool: Any, redis_server: Any
) -> None:
    """A message comes back to the worker that ran it once the store has lost its done mark
    (a RabbitMQ node killed as the ack came loses the ack, and the store then restarted
    empty): the worker remembers that the body began here and drops the copy, where the
    store alone would run it again."""
    store = RedisProc()
    once = {"headers": {SEND_HEADER: SEND_ONCE}}  # a second send is a copy of the first
    try:
        pool = make_pool(
            INTERVAL_S, store=store.url, record_url=redis_server.url_for(5), loglevel="INFO"
        )
        pool.recorder.delete(f"record:{pool.queue}")
        pool.start(1)
        first = pool.app.send_task("workerapp.record", args=(0,), queue=pool.queue, **once).id
        pool.wait_records(1, timeout_s=60)
        store.kill()
        store.restart()  # same port, empty
        pool.app.send_task("workerapp.record", args=(0,), queue=pool.queue, task_id=first, **once)
        later = pool.app.send_task("workerapp.record", args=(1,), queue=pool.queue).id
        deadline = time.monotonic() + 60
        while later not in {r["id"] for r in pool.records()}:
            assert time.monotonic() < deadline, "the task sent after the copy never started"
            time.sleep(0.1)
    finally:
        store.stop()
    assert Counter(r["id"] for r in pool.records())[first] == 1, "the copy ran again"
    assert f"task {first} already began here, dropping duplicate copy" in pool.workers[0].log()


def two_workers(
    make_pool: Any, redis_server: Any, store: RedisProc
) -> tuple[Pool, Worker, Worker, str]:
    """Worker A on the pool's queue and worker B on another queue, on ``store``; B's tasks are
    sent into A's bucket. Returns the pool, A, B and B's queue."""
    pool = make_pool(
        INTERVAL_S, store=store.url, record_url=redis_server.url_for(5), loglevel="INFO"
    )
    pool.recorder.delete(f"record:{pool.queue}")
    other = f"{pool.queue}-b"  # only worker B consumes it; its tasks are in A's bucket
    (a,) = pool.start(1, queues=pool.queue)
    (b,) = pool.start(1, queues=other)
    return pool, a, b, other


def test_a_copy_on_another_worker_after_the_store_lost_its_state_is_dropped(
    make_pool: Any, redis_server: Any
) -> None:
    """A task ran on worker A; the store then lost its state, and a copy of the task's message
    reaches worker B (an ack lost with a killed RabbitMQ node comes back to any consumer).
    B's claim waits for the settle after the store's new birth, A writes again the done marks
    of what ran on it as its next claim sees that birth, and B drops the copy."""
    store = RedisProc()
    once = {SEND_HEADER: SEND_ONCE}
    try:
        pool, a, b, other = two_workers(make_pool, redis_server, store)
        first = pool.app.send_task("workerapp.record", args=(0,), queue=pool.queue, headers=once).id
        in_a_bucket = {BUCKET_HEADER: pool.queue}
        pool.app.send_task("workerapp.record", args=(1,), queue=other, headers=in_a_bucket)
        pool.wait_records(2, timeout_s=60)
        store.kill()
        store.restart()  # same port, empty: a new birth
        pool.app.send_task(
            "workerapp.record",
            args=(0,),
            queue=other,
            task_id=first,
            headers={**once, **in_a_bucket},
        )
        time.sleep(0.5)  # B claims the copy before A, on its next claim, sees the new birth
        later = pool.app.send_task("workerapp.record", args=(2,), queue=pool.queue).id
        deadline = time.monotonic() + 60
        while f"task {first} already done" not in b.log() or later not in {
            r["id"] for r in pool.records()
        }:
            assert time.monotonic() < deadline, "B never dropped the copy, or A never ran more"
            assert Counter(r["id"] for r in pool.records())[first] == 1, "the copy ran again"
            time.sleep(0.2)
    finally:
        store.stop()
    assert Counter(r["id"] for r in pool.records())[first] == 1, "the copy ran again"
    assert "the store was born again" in a.log()


def test_a_copy_of_a_body_that_ran_on_across_the_state_loss_is_dropped(
    make_pool: Any, redis_server: Any
) -> None:
    """A's body runs on while the store loses its state (its done mark, posted as it began, is
    lost); A's next claim meets the new birth, and the mark goes again as the body ends. A copy
    that reaches B after the settle window is dropped."""
    store = RedisProc()
    once = {SEND_HEADER: SEND_ONCE}
    try:
        pool, a, b, other = two_workers(make_pool, redis_server, store)
        long = pool.app.send_task("workerapp.span", args=(0, 4.0), queue=pool.queue, headers=once)
        pool.wait_records(1, timeout_s=60)
        store.kill()
        store.restart()  # same port, empty: a new birth while the body runs
        meets = pool.app.send_task("workerapp.record", args=(1,), queue=pool.queue).id
        deadline = time.monotonic() + 60
        while not (("end", long.id) in kinds(pool) and ("start", meets) in kinds(pool)):
            assert time.monotonic() < deadline, "the long body never ended, or A never claimed"
            time.sleep(0.1)
        time.sleep(3.5)  # past the settle window that A's claim opened
        in_a_bucket = {BUCKET_HEADER: pool.queue}
        copy = {**once, **in_a_bucket}
        pool.app.send_task("workerapp.span", args=(0,), queue=other, task_id=long.id, headers=copy)
        while f"task {long.id} already done" not in b.log():
            assert time.monotonic() < deadline + 30, "B never dropped the copy"
            assert kinds(pool)[("start", long.id)] == 1, "the copy ran again"
            time.sleep(0.2)
    finally:
        store.stop()
    assert kinds(pool)[("start", long.id)] == 1, "the copy ran again"
    assert "the store was born again" in a.log()


def kinds(pool: Pool) -> Counter[tuple[str, str]]:
    """How many records of each (kind, task id) the pool's tasks wrote."""
    return Counter((r["kind"], r["id"]) for r in pool.records())


def died_as_they_started(pool: Pool, kills: list[Kill]) -> set[str]:
    """Tasks admitted to a killed worker as it died (``admitted_as_it_died``)."""
    return {e["task"] for e in ledger(pool) if "again" not in e and admitted_as_it_died(e, kills)}


def wait_settled(pool: Pool, tasks: set[str], timeout_s: float = 30.0) -> set[str]:
    """Wait until each task has a start record or a copy dropped as a duplicate; returns the
    tasks without a start record."""
    deadline = time.monotonic() + timeout_s
    while True:
        started = {r["id"] for r in pool.records()}
        dropped = {
            e["task"] for e in ledger(pool) if e["op"] in ("grant:DUPLICATE", "claim:DUPLICATE")
        }
        unsettled = tasks - started - dropped
        if not unsettled or time.monotonic() > deadline:
            assert not unsettled, f"neither started nor dropped as a copy: {unsettled}"
            return tasks - started
        time.sleep(0.2)


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_sigkill_one_then_two_of_three_workers(make_pool: Any, broker: str) -> None:
    """The broker returns a dead worker's unacked messages (RabbitMQ at once, Redis after the
    visibility timeout); a copy of a claimed one waits for its lease (3 s here) to expire,
    then runs, unless its body had begun (``DYING_START_US``); nothing is lost or started
    twice."""
    conf: dict[str, Any] = {"interval_lease_s": 3.0}
    if broker == "redis":
        conf.update(redis_visibility(4.0))
    pool = make_pool(INTERVAL_S, broker=broker, conf=conf)
    first, second, _ = pool.start(3)
    ids = pool.send(150)
    kills: list[Kill] = []
    pool.wait_records(40, timeout_s=60)
    kills.append((first, pool.kill(first)))
    pool.wait_records(80, timeout_s=60)
    kills.append((second, pool.kill(second)))
    dying = died_as_they_started(pool, kills)
    pool.wait_records(150 - len(dying), timeout_s=120)
    died = wait_settled(pool, dying)
    records = pool.wait_records(150 - len(died), timeout_s=120)
    ran_ids = [i for i in ids if i not in died]
    # On failure, a doubled task's starts and ledger entries say which window it ran twice in.
    doubled = {i for i, n in Counter(r["id"] for r in records).items() if n > 1}
    history = [r for r in records if r["id"] in doubled]
    assert not doubled, history + [e for e in ledger(pool) if e.get("task") in doubled]
    assert_exactly_once(records, ran_ids)
    claim_gaps = assert_claims_spaced(pool, INTERVAL_S)
    name = f"test_sigkill_one_then_two_of_three_workers[{broker}]"
    publish(name, records, ran_ids, claim_gaps)
    print(f"FIGURES {name}: died as their bodies began (copies dropped): {len(died)}")
    assert_deadlines(records, INTERVAL_S)


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
    (key,) = pool.recorder.keys(mark_key(KEY_PREFIX, pool.queue, killed, 0)[:-1] + "*")
    lease = pool.recorder.get(key).decode().split("|")
    seconds, micros = pool.recorder.time()
    assert lease[0] == "L" and int(lease[3]) > seconds * 1_000_000 + micros, "lease not renewed"
    pool.kill(doomed)
    ends = pool.wait_records(6, kind="end", timeout_s=120)
    assert sorted(r["id"] for r in ends) == sorted(ids)
    starts = [r["id"] for r in pool.records() if r["kind"] == "start"]
    assert starts.count(killed) == 2, "the killed acks_late task runs again, once"
    assert all(starts.count(i) == 1 for i in ids if i != killed)


def admitted_to(pool: Pool, worker: Worker) -> frozenset[str]:
    """The tasks whose claims the store admitted to ``worker``'s processes."""
    return frozenset(
        e["task"]
        for e in ledger(pool)
        if e["op"] == "claim:OK" and e.get("holder", "").startswith(f"{worker.name}/")
    )


def run_one_fault(
    make_pool: Any, broker: str, concurrency: int = 2, **fault: str
) -> tuple[Pool, Worker, Worker, list[str], list[dict[str, Any]], str]:
    """A worker of ``concurrency`` processes with a ``faultapp`` hook that SIGKILLs it once,
    and a healthy one; 60 tasks. Returns the pool, both workers, the ids (less the one a Redis
    broker's worker may have popped as it died: ``tests/helpers/popped.py``), the start records
    and the killed task's id."""
    conf: dict[str, Any] = {"interval_lease_s": 2.0}
    if broker == "redis":
        conf.update(redis_visibility(3.0))
    pool = make_pool(INTERVAL_S, broker=broker, conf=conf, app_module="tests.helpers.faultapp")
    doomed = pool.start(1, concurrency=concurrency, **fault)[0]
    survivor = pool.start(1)[0]
    ids = pool.send(60)
    try:
        records = pool.wait_records(60, timeout_s=90)
    except AssertionError:
        records = [r for r in pool.records() if r["kind"] == "start"]
    assert doomed.proc.wait(timeout=10) == -signal.SIGKILL
    killed = pool.recorder.lrange(f"killed:{pool.queue}", 0, -1)
    assert len(killed) == 1
    missing = set(ids) - {r["id"] for r in records}
    popped = popped_as_killed(missing, [w.log() for w in pool.workers], pool.app.conf.broker_url)
    assert missing <= popped and len(popped) <= 1, f"{len(missing)} never ran: {missing}"
    return pool, doomed, survivor, [i for i in ids if i not in popped], records, killed[0].decode()


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_killed_after_its_claim_before_the_ack(make_pool: Any, broker: str) -> None:
    """The narrowest window: SIGKILL right after an OK claim, before the pool or the broker saw
    the task. RabbitMQ redelivers at once and the copy is HELD by the dead claim's lease (2 s);
    Redis redelivers after its 3 s visibility timeout. Either way the copy runs, once."""
    pool, doomed, survivor, ids, records, killed_id = run_one_fault(
        make_pool, broker, CI_TEST_KILL_AFTER_CLAIM="5"
    )
    assert_exactly_once(records, ids)
    assert [r["host"] for r in records if r["id"] == killed_id] == [survivor.name]
    outcomes = [e["op"] for e in ledger(pool) if e.get("task") == killed_id]
    if broker == "rabbitmq":
        # the copy waited for the dead claim's lease (at its take, or at a later claim)
        assert {"grant:HELD", "claim:HELD"} & set(outcomes), outcomes
    # the dead worker's claim and the copy's; on a loaded machine the dead worker may have
    # been admitted another task in the same moment (its bodies ran once: asserted above)
    assert_one_ok_claim_each(pool, ids, twice=killed_id, in_flight=admitted_to(pool, doomed))
    claim_gaps = assert_claims_spaced(pool, INTERVAL_S)
    publish(f"test_killed_after_its_claim_before_the_ack[{broker}]", records, ids, claim_gaps)


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_killed_after_the_body_started_before_the_ack(make_pool: Any, broker: str) -> None:
    """SIGKILL once a task's body has started but before its ack reached the broker: the
    broker gives the message back (RabbitMQ at once, Redis after its 3 s visibility timeout)
    and the copy is dropped as a duplicate, because the pool process marked the task done in
    the store before its body started. It never starts twice.

    The doomed worker has one pool process: the kill lands wherever a second process is, and
    one in its spin, its mark posted and its body not begun, loses its task (the guarantees
    page: a worker killed as a body starts), which on a loaded machine the kill's own delay
    makes likely enough to see."""
    pool, doomed, survivor, ids, records, killed_id = run_one_fault(
        make_pool, broker, concurrency=1, CI_TEST_KILL_BEFORE_ACK="5"
    )
    assert [r["host"] for r in records if r["id"] == killed_id] == [doomed.name]
    # The copy must have come back and met the mark, or this test proves nothing.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        outcomes = [e["op"] for e in ledger(pool) if e.get("task") == killed_id]
        if {"grant:DUPLICATE", "claim:DUPLICATE"} & set(outcomes):
            break
        time.sleep(0.2)
    assert {"grant:DUPLICATE", "claim:DUPLICATE"} & set(outcomes), outcomes
    records = pool.wait_records(len(ids))
    assert_exactly_once(records, ids)
    # A task the dead worker was admitted to start but never began (its next claim, within
    # the lead, as the kill came) is admitted again after the lease; one it began is not.
    began_there = {r["id"] for r in records if r["host"] == doomed.name}
    assert_one_ok_claim_each(pool, ids, in_flight=admitted_to(pool, doomed) - began_there)
    claim_gaps = assert_claims_spaced(pool, INTERVAL_S)
    publish(
        f"test_killed_after_the_body_started_before_the_ack[{broker}]", records, ids, claim_gaps
    )
    assert any(r["host"] == survivor.name for r in records)


def test_redis_visibility_timeout_shorter_than_the_hold(make_pool: Any) -> None:
    """Held up to 10 s against a 4 s visibility timeout: the workers keep refreshing the scores
    of the messages they hold (every third of the timeout: a worker's loop may stall 2.6 s on
    a loaded machine), so the Redis broker delivers none of them again while its worker lives;
    each task is received once, granted its slot and started once."""
    interval_s = 0.05
    # Parking off: a parked task taken back is received a second time by design.
    conf = {**redis_visibility(4.0), "interval_overflow": False, "interval_max_held": 200}
    pool = make_pool(interval_s, broker="redis", conf=conf, loglevel="INFO")
    pool.start(3)
    ids = pool.send(200)
    records = pool.wait_records(200, timeout_s=120)
    assert_exactly_once(records, ids)
    received = Counter(
        task_id for w in pool.workers for task_id in received_list(w.log()) if task_id in ids
    )
    again = {t: n for t, n in received.items() if n > 1}
    assert not again, f"delivered again while held: {again}"
    assert set(received) == set(ids)
    assert_one_ok_claim_each(pool, ids)
    claim_gaps = assert_claims_spaced(pool, interval_s)
    publish("test_redis_visibility_timeout_shorter_than_the_hold", records, ids, claim_gaps)
    print(f"FIGURES utilization {utilization(records, interval_s):.3f}")  # bench/pool.py's


@contextlib.contextmanager
def rabbit_with_consumer_timeout(timeout_ms: int) -> Iterator[RabbitNode]:
    """A private RabbitMQ node whose consumer_timeout (checked every second) is ``timeout_ms``:
    the shared node, and every other test's channels on it, keep theirs."""
    with RabbitNode() as node:
        node.ctl("eval", f"application:set_env(rabbit, consumer_timeout, {timeout_ms}).")
        node.ctl("eval", "application:set_env(rabbit, channel_tick_interval, 1000).")
        yield node


def test_rabbitmq_consumer_timeout_shorter_than_a_hold(make_pool: Any) -> None:
    """A pause holds messages past a 3 s consumer_timeout: RabbitMQ closes the channels. The
    library turned broker_channel_error_retry on, so the workers reconnect, the messages come
    back with their slots, and after the unpause each task runs once, spaced."""
    interval_s = 0.05
    with rabbit_with_consumer_timeout(3000) as node:
        pool = make_pool(interval_s, broker=node.url, conf={"interval_broker_timeout_s": 3.0})
        try:
            workers = pool.start(3)
            broadcast_to_all(pool, "pause_queue")
            ids = pool.send(60)
            time.sleep(8.0)  # at least two consumer timeouts while paused
            assert not pool.records(), "a task started while paused"
            broadcast_to_all(pool, "unpause_queue")
            records = pool.wait_records(60, timeout_s=90)
            assert all(w.proc.poll() is None for w in workers), "a worker exited"
            logs = "".join(w.log() for w in workers)
            assert "PRECONDITION_FAILED" in logs or "timed out" in logs, "no consumer timeout"
            assert_exactly_once(records, ids)
            # A channel closing while the pool has not yet accepted a released task: Celery
            # drops the job; its copy waits out the lease and is admitted again. Once, and it
            # runs once.
            in_flight = released_as_the_channel_closed(pool)
            if assert_one_ok_claim_each(pool, ids, in_flight=in_flight):
                records = pool.wait_records(60, timeout_s=5)
                assert_exactly_once(records, ids)
        finally:
            pool.stop()  # while its broker is up
    claim_gaps = assert_claims_spaced(pool, interval_s)
    publish("test_rabbitmq_consumer_timeout_shorter_than_a_hold", records, ids, claim_gaps)


def test_pause_longer_than_the_redis_visibility_timeout(make_pool: Any) -> None:
    """Paused 7 s against a 2 s visibility timeout: the held messages stay with their workers
    (their scores refreshed), none is delivered again; after the unpause each starts once."""
    interval_s = 0.05
    pool = make_pool(interval_s, broker="redis", conf=redis_visibility(2.0), loglevel="INFO")
    pool.start(3)
    ids = pool.send(20)
    pool.wait_records(5, timeout_s=30)
    broadcast_to_all(pool, "pause_queue")
    time.sleep(7.0)
    before = len(pool.records())
    broadcast_to_all(pool, "unpause_queue")
    records = pool.wait_records(20, timeout_s=60)
    assert before < 20
    assert_exactly_once(records, ids)
    received = Counter(t for w in pool.workers for t in received_list(w.log()) if t in ids)
    assert max(received.values()) == 1, f"delivered again during the pause: {received}"
    assert_one_ok_claim_each(pool, ids)
    claim_gaps = assert_claims_spaced(pool, interval_s)
    publish("test_pause_longer_than_the_redis_visibility_timeout", records, ids, claim_gaps)


def test_store_unreachable_for_seconds_keeps_its_state(make_pool: Any, redis_server: Any) -> None:
    """The store hangs (SIGSTOP) for 4 s with its state intact: no task starts meanwhile, all
    run once afterwards, each worker logs the outage once, and the epoch does not change."""
    store = RedisProc()
    try:
        pool = make_pool(
            INTERVAL_S,
            store=store.url,
            record_url=redis_server.url_for(6),
            conf={"interval_store_timeout_s": 0.5},
        )
        pool.recorder.delete(f"record:{pool.queue}")
        pool.start(3)
        ids = pool.send(150)
        pool.wait_records(40, timeout_s=60)
        assert store.proc is not None
        store.proc.send_signal(signal.SIGSTOP)
        stopped_at_ns = time.monotonic_ns()
        time.sleep(4.0)
        during = [
            r for r in pool.records() if r["deadline_ns"] > stopped_at_ns + ADMITTED_BEFORE_NS
        ]
        store.proc.send_signal(signal.SIGCONT)
        assert not during, f"{len(during)} tasks started while the store hung"
        records = pool.wait_records(150, timeout_s=120)
        entries = ledger_entries(redis.Redis.from_url(store.url), pool.queue)
        epochs = {e["epoch"] for e in entries if "epoch" in e}
    finally:
        store.stop()
    assert_exactly_once(records, ids)
    assert len(epochs) == 1, f"the state was kept, yet epochs {epochs}"
    deadline_gaps = deadline_gaps_us(records)
    publish("test_store_unreachable_for_seconds_keeps_its_state", records, ids, deadline_gaps)
    assert_deadlines(records, INTERVAL_S)
    assert_one_line_per_outage(pool, records, stopped_at_ns)
    for worker in pool.workers:
        assert "new epoch" not in worker.log()


def test_a_worker_behind_a_slow_link_to_the_store(make_pool: Any, redis_server: Any) -> None:
    """One worker reaches the store through a proxy adding 15 ms each way (30 ms per round trip,
    longer than the 20 ms interval); claims stay exact on the store's clock, deadlines too."""
    with LatencyProxy("127.0.0.1", redis_server.port, delay_s=0.015) as proxy:
        pool = make_pool(INTERVAL_S)
        slow_store = f"redis://127.0.0.1:{proxy.port}/0"
        slow = pool.start(1, CI_TEST_STORE=slow_store, CI_TEST_RECORD=pool.store)[0]
        pool.start(2)
        ids = pool.send(150)
        records = pool.wait_records(150, timeout_s=120)
    assert_exactly_once(records, ids)
    assert any(r["host"] == slow.name for r in records), "the slow worker never ran a task"
    assert_one_ok_claim_each(pool, ids)
    claim_gaps = assert_claims_spaced(pool, INTERVAL_S)
    publish("test_a_worker_behind_a_slow_link_to_the_store", records, ids, claim_gaps)
    assert_deadlines(records, INTERVAL_S)
