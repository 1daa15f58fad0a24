"""Error replies of a real Redis (OOM, MISCONF, NOPERM, a damaged key): nothing lost, nothing
run twice, every timer callback goes on, one log line as they start and one as they end."""

from __future__ import annotations

import contextlib
import logging
import pickle
import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_interval.demo.embedded import RedisProc
from celery_interval.errors import StoreError, StoreUnavailable
from celery_interval.headers import SEND_HEADER
from celery_interval.placement import generation_of
from celery_interval.schedule import Lease, Outcome, Pace
from celery_interval.stores import keys
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.codec import decode_mark
from celery_interval.stores.redis import RedisStore
from celery_interval.stores.redis_client import store_errors
from celery_interval.throttled import Throttled
from celery_interval.worker.held import HeldState
from celery_interval.worker.service import IntervalService
from tests.helpers.fakeclock import Clock
from tests.helpers.fakes import Timer, fire_due, held_copy, make_service
from tests.helpers.logs import worker_log

DEDUPE_TTL_US = 7_200_000_000


@pytest.fixture(scope="module")
def server() -> Iterator[RedisProc]:
    """A private redis-server of this module: its tests set its memory limit and its ACLs."""
    proc = RedisProc()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def client(server: RedisProc) -> Iterator[redis.Redis[Any]]:
    c: redis.Redis[Any] = redis.Redis.from_url(server.url)
    c.config_set("maxmemory", "0")
    c.flushall()
    try:
        yield c
    finally:
        c.config_set("maxmemory", "0")
        c.close()


@contextlib.contextmanager
def out_of_memory(client: redis.Redis[Any]) -> Iterator[None]:
    """Every write refused with OOM while inside (reads and deletes still go through)."""
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")
    try:
        yield
    finally:
        client.config_set("maxmemory", "0")


def lines(records: list[logging.LogRecord], text: str) -> list[str]:
    return [r.getMessage() for r in records if text in r.getMessage()]


def service_on(client: redis.Redis[Any], clock: Clock) -> IntervalService:
    return make_service(RedisStore(client, now_us=clock), [], clock=clock)  # type: ignore[arg-type]


# -- which replies pass -----------------------------------------------------------------


#: Error replies, and whether they pass (retried as an outage) or are a bug (refused).
REPLIES = [
    ("MISCONF Redis is configured to save RDB snapshots", True),
    ("BUSY Redis is busy running a script", True),
    ("NOREPLICAS Not enough good replicas to write", True),
    ("OOM command not allowed when used memory > 'maxmemory'", True),
    ("NOPERM this user has no permissions to run the 'evalsha' command", True),
    ("ERR user_script:3: attempt to compare nil with number", False),
    ("WRONGTYPE Operation against a key holding the wrong kind of value", False),
]


def test_error_replies_that_pass_are_retried_as_outages_others_are_bugs(
    client: redis.Redis[Any],
) -> None:
    found = {}
    for reply, _passes in REPLIES:
        with pytest.raises(StoreError) as info, store_errors("test", "grant"):
            client.eval(f"return redis.error_reply({reply!r})", 0)
        assert reply.split(" ", 1)[1] in str(info.value), "the reply is quoted"
        found[reply] = isinstance(info.value, StoreUnavailable)
    assert found == dict(REPLIES)


def test_an_oom_refusal_changed_nothing_and_the_call_goes_through_once_it_clears(
    client: redis.Redis[Any],
) -> None:
    clock = Clock(1_000_000_000)
    store = RedisStore(client, now_us=clock)
    copy = TaskCopy("api", "t1", 0)
    with out_of_memory(client):
        with pytest.raises(StoreUnavailable, match=r"OOM|maxmemory"):
            store.grant(copy, Pace(50_000))
        assert client.dbsize() == 0, "a refused script wrote nothing"
    assert store.grant(copy, Pace(50_000)).ticket == 1


def test_a_failed_disk_save_misconf_is_retried_as_an_outage() -> None:
    """MISCONF: a save point, stop-writes-on-bgsave-error, and a BGSAVE that cannot write
    (its directory is gone); cleared by turning stop-writes-on-bgsave-error off."""
    with RedisProc() as proc:
        c: redis.Redis[Any] = redis.Redis.from_url(proc.url)
        c.config_set("save", "3600 1")
        c.config_set("stop-writes-on-bgsave-error", "yes")
        shutil.rmtree(proc.dir)
        c.bgsave()
        deadline = time.monotonic() + 10
        while c.info("persistence")["rdb_last_bgsave_status"] != "err":
            assert time.monotonic() < deadline, "BGSAVE did not fail"
            time.sleep(0.05)
        store = RedisStore(c)
        with pytest.raises(StoreUnavailable, match="MISCONF"):
            store.grant(TaskCopy("api", "t1", 0), Pace(50_000))
        c.config_set("stop-writes-on-bgsave-error", "no")
        assert store.grant(TaskCopy("api", "t1", 0), Pace(50_000)).ticket == 1
        c.close()


@pytest.fixture
def limited(client: redis.Redis[Any], server: RedisProc) -> Iterator[str]:
    """The URL of a user whose script calls ``scripts_refused`` turns off (NOPERM): unlike
    OOM, which Redis checks only at a script's first write that may grow memory (a script
    that deletes first runs through), this refuses every call."""
    client.acl_setuser("lim", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all"])
    try:
        yield f"redis://lim:pw@127.0.0.1:{server.port}/0"
    finally:
        client.acl_deluser("lim")


@contextlib.contextmanager
def scripts_refused(client: redis.Redis[Any]) -> Iterator[None]:
    client.acl_setuser("lim", enabled=True, commands=["-@scripting"])  # and FCALL on Redis 7
    try:
        yield
    finally:
        client.acl_setuser("lim", enabled=True, commands=["+@all"])


def test_a_user_without_the_scripting_commands_is_retried_as_an_outage(
    client: redis.Redis[Any], limited: str
) -> None:
    store = RedisStore.from_url(limited)
    with scripts_refused(client), pytest.raises(StoreUnavailable, match=r"NOPERM|permission"):
        store.grant(TaskCopy("api", "t1", 0), Pace(50_000))
    assert store.grant(TaskCopy("api", "t1", 0), Pace(50_000)).ticket == 1
    store.close()


# -- the worker's callbacks -------------------------------------------------------------


def test_a_task_received_while_the_store_is_out_of_memory_is_held_then_runs_once(
    client: redis.Redis[Any],
) -> None:
    clock = Clock(1_000_000_000)
    service = service_on(client, clock)
    started: list[str] = []
    with worker_log() as records:
        with out_of_memory(client):
            for task_id in ("a", "b"):  # as many as the pool's processes
                service.receive(held_copy(service, task_id, started))
            fire_due(service.timer, clock, within_s=0.5)  # every retry refused again
            assert started == [] and service.holding.count == 2
        fire_due(service.timer, clock, within_s=service.settings.retry_max_s + 1)
    assert sorted(started) == ["a", "b"]
    assert len(lines(records, "interval store refusing calls")) == 1, records
    assert len(lines(records, "interval store reachable again")) == 1, records


def test_done_marks_refused_are_sent_again_and_a_redelivered_copy_is_dropped(
    client: redis.Redis[Any],
) -> None:
    clock = Clock(1_000_000_000)
    service = service_on(client, clock)
    with out_of_memory(client):
        service.mark_done("api", "done-1", 0)
        service.done.flush()
        assert service.done.pending == [TaskCopy("api", "done-1", 0)]
        assert any(e[1] == service.done.flush for e in service.timer.entries), "flush again"
    fire_due(service.timer, clock, within_s=service.settings.retry_max_s + 1)
    assert service.done.pending == []
    grant = service.store.grant(TaskCopy("api", "done-1", 0), Pace(50_000))
    assert grant.outcome is Outcome.DUPLICATE


def test_lease_and_place_renewals_and_pause_polls_go_on_through_a_refusal(
    client: redis.Redis[Any], limited: str
) -> None:
    clock = Clock(1_000_000_000)
    service = make_service(RedisStore.from_url(limited, now_us=clock), [])  # type: ignore[arg-type]
    started: list[str] = []
    held = held_copy(service, "long", started)
    held.acks_late = True
    service.receive(held)
    fire_due(service.timer, clock, within_s=0.5)
    assert started == ["long"] and service.leases.holders
    service.places.hold(held.request, TaskCopy("capped", "p", 0), 1)
    service.store.pause("paused", 50_000)
    waiting = held_copy(service, "w", [])
    waiting.bucket = "paused"
    service.paused.add(waiting)
    renewals = (service.leases._renew, service.places._renew, service.paused._poll)
    quiet = service.outage._quiet
    with worker_log() as records:
        with scripts_refused(client):
            for _ in range(3):
                for entry in [e for e in service.timer.entries if e[1] in renewals]:
                    service.timer.entries.remove(entry)
                    entry[1](*entry[2])
            armed = {e[1] for e in service.timer.entries}
            assert all(callback in armed for callback in renewals), "each looks again"
        assert service.leases.holders and service.places.running
        assert service.paused.held["paused"] == [waiting]
        lease_s = service.settings.lease_us / 1e6
        clock.now_us += int(lease_s * 0.9e6)  # the lease would lapse without this renewal
        for entry in [e for e in service.timer.entries if e[1] in (*renewals, quiet)]:
            service.timer.entries.remove(entry)
            entry[1](*entry[2])
        for entry in [e for e in service.timer.entries if e[1] == quiet]:
            service.timer.entries.remove(entry)
            entry[1](*entry[2])  # nothing failed since the store answered: the end is logged
    assert len(lines(records, "interval store refusing calls")) == 1, records
    assert len(lines(records, "interval store reachable again")) == 1, records
    (raw,) = [client.get(k) for k in client.keys("*:m:long:0")]
    mark = decode_mark(raw)
    assert isinstance(mark, Lease) and mark.expires_real_us == clock.now_us + int(lease_s * 1e6), (
        f"the lease was renewed from now on: {raw!r}"
    )
    assert service.places.running, "the place was renewed"


def test_a_damaged_key_holds_the_task_logged_as_a_bug_until_it_is_fixed(
    client: redis.Redis[Any],
) -> None:
    clock = Clock(1_000_000_000)
    service = service_on(client, clock)
    started: list[str] = []
    state_key = keys.state_key(service.store.prefix, "api")  # type: ignore[attr-defined]
    client.set(state_key, "not a hash")
    with pytest.raises(StoreError) as info:
        service.store.grant(TaskCopy("api", "a", 0), Pace(50_000))
    assert not isinstance(info.value, StoreUnavailable), "retrying cannot cure a damaged key"
    held = held_copy(service, "a", started)
    with worker_log() as records:
        service.receive(held)
        fire_due(service.timer, clock, within_s=0.5)
        assert started == [] and not held.request.acked and held.state is HeldState.GRANTING
        client.delete(state_key)
        fire_due(service.timer, clock, within_s=5.0)
    assert started == ["a"]
    assert len(lines(records, "not an outage")) == 1, records


# -- the pool process -------------------------------------------------------------------


def test_a_pool_process_claiming_again_waits_out_a_refusal(
    client: redis.Redis[Any], limited: str
) -> None:
    """A body that reached its process after its start claims again; the store answers OOM:
    the claim is retried (the task is neither failed nor acked unrun)."""
    from celery import Celery

    from celery_interval.app_store import store_of
    from celery_interval.stores.base import ClaimArgs
    from celery_interval.worker.process import started as started_mod

    app = Celery("claim_again", set_as_current=False)
    app.conf.interval_store_url = limited
    app.conf.interval_queues = {"api": 0.05}
    store = store_of(app)
    grant = store.grant(TaskCopy("api", "t1", 0), Pace(50_000))
    claimed = ClaimArgs("api", "t1", 0, 50_000, grant.epoch, grant.slot_us, "w/1", grant.ticket, 0)
    result: list[Any] = []

    def claim() -> None:
        try:
            result.append(started_mod._claim_again(app, claimed, 10_000_000, 3_000_000))
        except BaseException as exc:
            result.append(exc)

    with scripts_refused(client):
        thread = threading.Thread(target=claim)
        thread.start()
        thread.join(0.5)
        assert thread.is_alive() and not result, f"gave up during the refusal: {result}"
    thread.join(10)
    assert len(result) == 1 and isinstance(result[0], tuple), result
    start_ns, start_us = result[0]
    assert isinstance(start_ns, int) and isinstance(start_us, int), result


def test_a_posted_done_mark_the_store_refused_is_posted_again(
    client: redis.Redis[Any],
) -> None:
    store = RedisStore(client)
    copy = TaskCopy("api", "posted-1", 0)
    store.prepare_post()
    with out_of_memory(client):
        store.post_done(copy, DEDUPE_TTL_US)
        time.sleep(0.2)  # the refusal arrives
        store.prepare_post()  # reads it
    deadline = time.monotonic() + 5
    while store.grant(copy, Pace(50_000)).outcome is not Outcome.DUPLICATE:
        assert time.monotonic() < deadline, "the refused mark was never sent again"
        time.sleep(0.05)
        store.prepare_post()
    store.close()


def throttled_while_refused(
    client: redis.Redis[Any], url: str, headers: dict[str, Any]
) -> tuple[dict[str, Any], Any]:
    """Run ``worker.process.throttle.throttled`` for a real task's body (its request carrying
    ``headers``, as a worker's does) that raised ``Throttled(2.0)`` while the store refuses
    every script: the options of the copy it published (to an in-memory broker, its headers
    stamped as ``before_task_publish`` does), and the ``Retry`` it raised."""
    from celery import Celery
    from celery.exceptions import Retry
    from celery.signals import before_task_publish

    from celery_interval.headers import CLAIM_HEADER, stamp_send
    from celery_interval.stores.base import ClaimArgs
    from celery_interval.worker.process.throttle import throttled

    app = Celery("throttle", set_as_current=False, broker="memory://")
    app.conf.interval_store_url = url
    app.conf.interval_queues = {"api": 0.05}
    claimed = ClaimArgs("api", "t1", 0, 50_000, 1, 1, "w/1", 1, 0)
    sent: list[dict[str, Any]] = []

    @app.task(name="api.call", shared=False)
    def call() -> None: ...

    def published(headers: dict[str, Any], properties: Any = None, **_: Any) -> None:
        stamp_send(headers=headers)
        sent.append({"headers": dict(headers), "eta": headers.get("eta")})

    before_task_publish.connect(published, weak=False)
    call.push_request({"id": "t1", "retries": 0, CLAIM_HEADER: claimed, **headers})
    try:
        with scripts_refused(client), pytest.raises(Retry) as raised:
            throttled(call, Throttled(2.0))
    finally:
        call.pop_request()
        before_task_publish.disconnect(published)
    assert len(sent) == 1, sent
    return sent[0], raised.value


def test_a_throttle_the_store_refuses_sends_the_task_again_after_the_wait(
    client: redis.Redis[Any], limited: str
) -> None:
    """A body raised Throttled and the store refuses the throttle: the task is not failed (and
    acked unrun); it is sent again to run after the wait, as during an outage."""
    sent, retry = throttled_while_refused(client, limited, {})
    assert sent["eta"] is not None, sent  # the countdown of the wait
    # its worker learns (through the pickled exception) that the copy went plain
    cause = pickle.loads(pickle.dumps(retry)).exc
    assert isinstance(cause, Throttled) and cause.place_kept is False


@pytest.mark.parametrize("send", ["once", "0badc0de"])
def test_the_plain_copy_of_a_refused_throttle_is_not_a_duplicate_of_the_run(
    client: redis.Redis[Any], limited: str, send: str
) -> None:
    """The throttled run's done mark was posted as its body began; the copy sent plain (the
    store refused the throttle) is a new send, which that mark does not drop, even for a
    message sent to run once per task id (the Spark fan-out's)."""
    store = RedisStore(client)
    ran = TaskCopy("api", "t1", generation_of({SEND_HEADER: send}))
    store.prepare_post()
    store.post_done(ran, DEDUPE_TTL_US)
    deadline = time.monotonic() + 5
    while store.grant(ran, Pace(50_000)).outcome is not Outcome.DUPLICATE:
        assert time.monotonic() < deadline, "the done mark was never posted"
        time.sleep(0.01)
    assert store.grant(ran, Pace(50_000)).outcome is Outcome.DUPLICATE
    sent, _ = throttled_while_refused(client, limited, {SEND_HEADER: send})
    copy = TaskCopy("api", "t1", generation_of(sent["headers"]))
    assert store.grant(copy, Pace(50_000)).outcome is Outcome.OK, sent["headers"]
    store.close()


def test_refusals_between_answers_log_one_refusal_and_one_end() -> None:
    """Out of memory, Redis runs the scripts whose first write frees memory: answers and
    refusals alternate. One line as it starts, one once nothing failed for QUIET_S."""
    from celery_interval.errors import StoreRefused
    from celery_interval.worker.store.outage import StoreOutage

    timer = Timer()
    outage = StoreOutage(5.0, lambda: 3, timer)

    def fire_checks() -> None:
        for entry in list(timer.entries):
            timer.entries.remove(entry)
            entry[1](*entry[2])

    with worker_log() as records:
        for _ in range(5):
            outage.failed(StoreRefused("OOM command not allowed"))
            outage.answered()
            outage.failed(StoreRefused("OOM command not allowed"))
            fire_checks()  # a call failed since the answer: not over
        assert outage.since is not None
        outage.answered()
        outage.failed(StoreRefused("OOM command not allowed"))
        outage.answered()  # the last call went through
        fire_checks()  # a call failed since this check was armed: it looks again
        assert outage.since is not None and timer.entries
        fire_checks()
    assert outage.since is None
    assert len(lines(records, "interval store refusing calls")) == 1, records
    assert len(lines(records, "interval store reachable again")) == 1, records


def test_a_posted_done_mark_the_connection_took_along_is_posted_again() -> None:
    """The store hangs, a done mark is posted (written, never read), the store is killed and
    comes back with its data: the mark never ran, and the next prepare sends it again."""
    import os
    import signal

    server = RedisProc(durable=True)
    client: redis.Redis[Any] = redis.Redis.from_url(server.url)
    store = RedisStore(client)
    try:
        copy = TaskCopy("api", "posted-lost", 0)
        assert store.grant(copy, Pace(50_000)).outcome is Outcome.OK
        store.prepare_post()
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        store.post_done(copy, DEDUPE_TTL_US)  # in the socket's buffers, never executed
        server.restart()  # SIGKILL (it was stopped), then back with its append-only file
        assert store.grant(copy, Pace(50_000)).outcome is not Outcome.DUPLICATE, "it ran"
        store.prepare_post()  # the closed connection is found; the mark goes on a new one
        deadline = time.monotonic() + 5
        while store.grant(copy, Pace(50_000)).outcome is not Outcome.DUPLICATE:
            assert time.monotonic() < deadline, "the lost mark was never sent again"
            time.sleep(0.05)
            store.prepare_post()
    finally:
        store.close()
        client.close()
        server.stop()
