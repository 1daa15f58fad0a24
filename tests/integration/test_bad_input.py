"""Bad input, row by row: a clear error names the bad key or value, and nothing is lost."""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery

import celery_interval
from celery_interval.config import settings_of
from celery_interval.config.table import KEY_PREFIX
from celery_interval.demo.embedded import RedisProc
from celery_interval.errors import ConfigurationError, UnknownBucket
from celery_interval.stores.keys import state_key
from celery_interval.task import IntervalTask
from tests.helpers.assertions import assert_exactly_once, body_floor_us
from tests.helpers.pool import Pool, celery_cli

INTERVAL_S = 0.02

#: (value, how the error quotes it). ``None`` is bad wherever an interval is required.
BAD_INTERVALS: list[tuple[object, str]] = [
    (0, "0"),
    (-1, "-1"),
    (math.nan, "nan"),
    (math.inf, "inf"),
    ("fast", "'fast'"),
    ("10/fortnight", "'10/fortnight'"),
    (None, "None"),
    (10**400, "1000000"),  # too large for a float
    (1e20, "1e+20"),  # finite, but far past the one-day maximum
]
#: The same values as a command line types them.
BAD_INTERVAL_ARGS = ["0", "nan", "inf", "fast", "10/fortnight", "1e20"]


def _ids(rows: list[Any]) -> list[str]:
    return [repr(row[0] if isinstance(row, tuple) else row)[:20] for row in rows]


def _command_ids(rows: list[tuple[tuple[str, ...], str]]) -> list[str]:
    return [" ".join(args)[:30] for args, _ in rows]


def bucket_keys(client: redis.Redis[Any], bucket: str) -> list[bytes]:
    """Every store key of ``bucket`` (state, marks, ledger), whatever the prefix."""
    return list(client.scan_iter(match=f"*{{{bucket}}}*"))


# -- intervals in configuration, task options and the Python API ---------------------------


def _app(**conf: Any) -> Celery:
    app = Celery("bad_input", broker="memory://", set_as_current=False)
    app.conf.update({"interval_store_url": "memory://", "interval_queues": {"api": 1.0}, **conf})
    return app


@pytest.mark.parametrize(("value", "shown"), BAD_INTERVALS, ids=_ids(BAD_INTERVALS))
def test_interval_queues_value(value: object, shown: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        settings_of(_app(interval_queues={"api": 1.0, "mail": value}))
    assert f"interval_queues['mail']={shown}" in str(info.value)


BAD_STORE_URLS: list[tuple[object, str]] = [
    ("redis//x", "interval store URL 'redis//x' has no scheme"),
    ("redis://host:notaport", "malformed interval store URL 'redis://host:notaport'"),
    ("ftp://x", "interval store URL 'ftp://x' has unknown scheme 'ftp'"),
    (42, "interval_store_url=42: expected a URL string"),
    ("", "interval_store_url='': expected a URL string"),
    (
        "redis://127.0.0.1:1/0?encoding=latin-1",
        "encoding=latin-1: the store's keys and scripts are UTF-8 (drop encoding= from the",
    ),
]


@pytest.mark.parametrize(("url", "expected"), BAD_STORE_URLS, ids=_ids(BAD_STORE_URLS))
def test_interval_store_url(url: object, expected: str) -> None:
    """Through the settings, as every entry point opens the store (workers: see below)."""
    app = _app(interval_store_url=url, broker_url="redis://127.0.0.1:1/0")
    with pytest.raises(ConfigurationError) as info:
        celery_interval.status(app, "api")
    assert expected in str(info.value)


#: ``None`` is not among them: it is the task option's default (use the queue's interval).
BAD_TASK_INTERVALS = [row for row in BAD_INTERVALS if row[0] is not None]


@pytest.mark.parametrize(("value", "shown"), BAD_TASK_INTERVALS, ids=_ids(BAD_TASK_INTERVALS))
def test_task_option_interval_fails_when_the_task_is_bound(value: object, shown: str) -> None:
    app = _app()

    @app.task(base=IntervalTask, name="proj.call", interval=value, shared=False)
    def call() -> None: ...

    with pytest.raises(ConfigurationError) as info:
        app.finalize()
    assert f"proj.call.interval={shown}" in str(info.value)


@pytest.mark.parametrize(
    ("spec", "shown"),
    [(42, "42"), ("", "''"), ("x" * 10_240, "'xxxx")],
    ids=["int", "empty", "10KB"],
)
def test_task_option_interval_bucket_fails_when_the_task_is_bound(spec: object, shown: str) -> None:
    app = _app()

    @app.task(base=IntervalTask, name="proj.call", interval_bucket=spec, shared=False)
    def call() -> None: ...

    with pytest.raises(ConfigurationError) as info:
        app.finalize()
    message = str(info.value)
    assert f"proj.call.interval_bucket={shown}" in message and len(message) < 300


@pytest.fixture
def api_app(redis_server: Any, redis_client: redis.Redis[Any]) -> Celery:
    """An app whose store is the flushed private Redis; two configured queues."""
    app = Celery("bad_input", broker="memory://", set_as_current=False)
    app.conf.update(
        interval_store_url=redis_server.url_for(0), interval_queues={"api": 1.0, "mail": "30/m"}
    )
    return app


@pytest.mark.parametrize(("value", "shown"), BAD_INTERVALS, ids=_ids(BAD_INTERVALS))
def test_python_set_interval(
    api_app: Celery, redis_client: redis.Redis[Any], value: object, shown: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        celery_interval.set_interval(api_app, "api", value)
    assert f"interval={shown}" in str(info.value)
    assert bucket_keys(redis_client, "api") == [], "a refused command wrote to the store"


# -- control commands act on configured buckets only ----------------------------------------

PYTHON_COMMANDS: dict[str, Callable[[Celery, Any], object]] = {
    "pause": lambda app, q: celery_interval.pause(app, q, broadcast=False),
    "unpause": lambda app, q: celery_interval.unpause(app, q, broadcast=False),
    "set_interval": lambda app, q: celery_interval.set_interval(app, q, "10/s", broadcast=False),
    "unset_interval": lambda app, q: celery_interval.unset_interval(app, q, broadcast=False),
    "status": celery_interval.status,
    "reset": celery_interval.reset,
}
UNKNOWN_QUEUES: list[object] = ["nope", "nope:tenant", "", None, 42, ["api"], "api:" + "x" * 300]


@pytest.mark.parametrize("queue", UNKNOWN_QUEUES, ids=_ids(UNKNOWN_QUEUES))
@pytest.mark.parametrize("command", sorted(PYTHON_COMMANDS))
def test_python_api_refuses_an_unknown_queue(
    api_app: Celery, redis_client: redis.Redis[Any], command: str, queue: object
) -> None:
    with pytest.raises(UnknownBucket) as info:
        PYTHON_COMMANDS[command](api_app, queue)
    message = str(info.value)
    assert repr(queue)[:40] in message and message.endswith("configured: api, mail")
    assert len(message) < 300
    assert list(redis_client.scan_iter()) == [], "a refused command wrote to the store"


def test_a_tenant_bucket_of_a_configured_queue_is_accepted(
    api_app: Celery, redis_client: redis.Redis[Any]
) -> None:
    """``queue:key`` buckets (IntervalTask's per-tenant buckets) take their queue's interval."""
    paused = celery_interval.pause(api_app, "api:tenant-7", broadcast=False)
    assert paused.paused and paused.interval_us == 1_000_000
    assert redis_client.exists(state_key(KEY_PREFIX, "api:tenant-7"))
    assert not celery_interval.status(api_app, "api").paused, "the queue's own bucket is apart"
    changed = celery_interval.set_interval(api_app, "mail:t1", "2/s", broadcast=False)
    assert changed.interval_us == 500_000 and changed.overridden


# -- `celery -A proj interval …` (the real command line, no worker needed) ------------------

INTERVAL_CLI_ROWS: list[tuple[tuple[str, ...], str]] = [
    *((("set", "{q}", v), f"interval='{v}'") for v in BAD_INTERVAL_ARGS),
    (("set", "{q}", "-1"), "interval='-1': an interval must be finite and > 0"),
    (("set", "{q}"), "Missing argument 'INTERVAL'"),
    (("pause", "nope"), "unknown interval bucket 'nope'; configured: {q}"),
    (("unpause", "nope"), "unknown interval bucket 'nope'; configured: {q}"),
    (("set", "nope", "1"), "unknown interval bucket 'nope'; configured: {q}"),
    (("unset", "nope"), "unknown interval bucket 'nope'; configured: {q}"),
    (("reset", "nope"), "unknown interval bucket 'nope'; configured: {q}"),
    (("status", "nope"), "unknown interval bucket 'nope'; configured: {q}"),
    (("pause",), "Missing argument 'QUEUE'"),
    (("set", "{q}", "1", "2"), "unexpected extra argument (2)"),
    (("status", "{q}", "--timeout", "soon"), "'soon' is not a valid float"),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "expected"), INTERVAL_CLI_ROWS, ids=_command_ids(INTERVAL_CLI_ROWS)
)
def test_interval_command_line(make_pool: Any, args: tuple[str, ...], expected: str) -> None:
    pool = make_pool(INTERVAL_S, broker="redis")
    result = celery_cli(pool, "interval", *(a.format(q=pool.queue) for a in args))
    assert result.returncode != 0, result.stdout
    assert expected.format(q=pool.queue) in result.stderr, result.stderr
    assert bucket_keys(pool.recorder, "nope") == []
    assert not bucket_keys(pool.recorder, pool.queue), "a refused command wrote to the store"


# -- one live worker: remote control commands and corrupted messages -----------------------


@pytest.fixture(scope="module")
def live_pool(redis_server: RedisProc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """One real worker (Redis broker, result backend) shared by the worker-level rows."""
    if not redis_server.alive:
        redis_server.restart()
    pool = Pool(
        broker=redis_server.broker_url_for(9),
        store=redis_server.url_for(8),
        interval_s=INTERVAL_S,
        tmp=tmp_path_factory.mktemp("bad-input"),
        conf={"result_backend": redis_server.url_for(10)},
    )
    pool.start(1, concurrency=2)
    try:
        yield pool
    finally:
        pool.stop()


def _status(pool: Pool) -> Any:
    return celery_interval.status(pool.app, pool.queue)


CONTROL_ROWS: list[tuple[tuple[str, ...], str]] = [
    (("pause_queue", "nope"), "unknown interval bucket 'nope'; configured: {q}"),
    (("unpause_queue", "nope"), "unknown interval bucket 'nope'; configured: {q}"),
    (("set_interval", "nope", "1"), "unknown interval bucket 'nope'; configured: {q}"),
    (("unset_interval", "nope"), "unknown interval bucket 'nope'; configured: {q}"),
    (("pause_queue", "nope:tenant"), "unknown interval bucket 'nope:tenant'; configured: {q}"),
    *((("set_interval", "{q}", v), f"interval='{v}'") for v in BAD_INTERVAL_ARGS),
    (("set_interval", "{q}", "-1"), "No such option '-1'"),  # Celery's own parser
    (("set_interval", "{q}", "--", "-1"), "interval='-1': an interval must be finite and > 0"),
    (("set_interval", "{q}"), "interval=None: expected seconds > 0"),
    (("pause_queue",), "unknown interval bucket None; configured: {q}"),
    (("pause_queue", "{q}", "extra"), "takes arguments: <queue>"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("args", "expected"), CONTROL_ROWS, ids=_command_ids(CONTROL_ROWS))
def test_remote_control_command_line(live_pool: Pool, args: tuple[str, ...], expected: str) -> None:
    """`celery control …` prints each worker's error reply (Celery exits 0 even so)."""
    pool, worker = live_pool, live_pool.workers[0]
    argv = [a.format(q=pool.queue) for a in args]
    result = celery_cli(pool, "control", "-d", worker.name, "--timeout", "10", *argv)
    assert expected.format(q=pool.queue) in result.stdout + result.stderr, result
    after = _status(pool)
    assert (after.paused, after.overridden) == (False, False), "a refused command took effect"
    assert bucket_keys(pool.recorder, "nope") == []
    assert bucket_keys(pool.recorder, "nope:tenant") == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "arguments", "expected"),
    [
        ("pause_queue", lambda q: {"queue": 42}, "unknown interval bucket 42"),
        ("pause_queue", lambda q: {"queue": [q]}, "unknown interval bucket ['{q}']"),
        ("unpause_queue", lambda q: {"queue": None}, "unknown interval bucket None"),
        ("set_interval", lambda q: {"queue": q, "interval": [1]}, "interval=[1]"),
        ("set_interval", lambda q: {"queue": q, "interval": True}, "interval=True"),
    ],
    ids=["int", "list", "none", "interval-list", "interval-bool"],
)
def test_remote_control_wrong_argument_types(
    live_pool: Pool, command: str, arguments: Callable[[str], dict[str, Any]], expected: str
) -> None:
    """A program broadcasting the commands with wrong types gets an error reply, too."""
    pool, worker = live_pool, live_pool.workers[0]
    replies = pool.app.control.broadcast(
        command,
        arguments=arguments(pool.queue),
        reply=True,
        destination=[worker.name],
        limit=1,
        timeout=10,
    )
    assert replies and set(replies[0]) == {worker.name}, replies
    reply = replies[0][worker.name]
    assert expected.format(q=pool.queue) in reply.get("error", ""), reply
    assert not _status(pool).paused and not _status(pool).overridden


def _wait_ids(pool: Pool, ids: list[str], timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Start records of ``ids`` once each has one (and a little longer, for strays)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if set(ids) <= {r["id"] for r in pool.records()}:
            time.sleep(0.3)
            break
        time.sleep(0.05)
    return [r for r in pool.records() if r["id"] in ids]


def _broker_backlog(pool: Pool) -> tuple[int, int]:
    """(messages waiting in the queue, messages delivered but not acknowledged) on the Redis
    broker: kombu keeps the unacknowledged ones in the ``unacked`` hash."""
    client = redis.Redis.from_url(pool.broker)
    try:
        return int(client.llen(pool.queue)), int(client.hlen("unacked"))
    finally:
        client.close()


def _failures(pool: Pool) -> list[dict[str, Any]]:
    """The task_failure signals the pool's workers saw (tests/helpers/workerapp.py records them)."""
    return [json.loads(f) for f in pool.recorder.lrange(f"failure:{pool.queue}", 0, -1)]


CORRUPT_ROWS: list[tuple[str, str, dict[str, Any], dict[str, Any], str]] = [
    # (row id, task, kwargs, message headers, the error the result carries)
    ("bucket-int", "record", {}, {"interval_bucket": 5}, "message header interval_bucket=5: "
     "expected a non-empty string"),
    ("bucket-empty", "record", {}, {"interval_bucket": ""}, "message header interval_bucket='': "
     "expected a non-empty string"),
    ("bucket-10KB", "record", {}, {"interval_bucket": "x" * 10_240}, "message header "
     "interval_bucket='xxxx"),
    ("bucket-10KB-of-queue", "record", {}, {"interval_bucket": "{q}:" + "x" * 10_240},
     "a bucket name is at most 200 characters"),
    ("bucket-unknown", "record", {}, {"interval_bucket": "nope"}, "message header "
     "interval_bucket='nope': unknown interval bucket 'nope'; configured: {q}"),
    ("retries-text", "record", {}, {"retries": "abc"}, "message header retries='abc': "
     "expected an integer >= 0"),
    ("retries-negative", "record", {}, {"retries": -1}, "message header retries=-1"),
    ("bucket-callable-raises", "tenant_kw", {}, {}, "workerapp.tenant_kw.interval_bucket "
     "raised KeyError('tenant')"),
    ("bucket-callable-returns-empty", "tenant_kw", {"tenant": ""}, {}, "workerapp.tenant_kw"
     ".interval_bucket returned ''"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("task", "kwargs", "headers", "expected"),
    [row[1:] for row in CORRUPT_ROWS],
    ids=[row[0] for row in CORRUPT_ROWS],
)
def test_corrupted_message_fails_visibly_and_the_worker_goes_on(
    live_pool: Pool, task: str, kwargs: dict[str, Any], headers: dict[str, Any], expected: str
) -> None:
    pool, worker = live_pool, live_pool.workers[0]
    expected = expected.format(q=pool.queue)
    sent = {k: v.format(q=pool.queue) if isinstance(v, str) else v for k, v in headers.items()}
    good_before = pool.send(2)
    bad = pool.app.send_task(
        f"workerapp.{task}", args=(-1,), kwargs=kwargs, queue=pool.queue, headers=sent
    )
    good_after = pool.send(2)
    bad.get(timeout=30, propagate=False)
    assert bad.state == "FAILURE" and expected in str(bad.result), (bad.state, bad.result)
    assert len(str(bad.result)) < 300, "the error quotes a long value in full"
    good = [*good_before, *good_after]
    records = _wait_ids(pool, good)
    assert_exactly_once(records, good)
    assert bad.id not in {r["id"] for r in pool.records()}, "the bad message ran"
    assert worker.proc.poll() is None, "the worker died"
    logged = [ln for ln in worker.log().splitlines() if f"task {bad.id} cannot be scheduled" in ln]
    assert len(logged) == 1 and expected in logged[0], logged
    failures = [f for f in _failures(pool) if f["id"] == bad.id]
    assert len(failures) == 1, "one task_failure signal for the bad message"
    assert expected in failures[0]["error"], failures
    assert bucket_keys(pool.recorder, "nope") == []


@pytest.mark.slow
def test_forged_internal_headers_are_ignored(live_pool: Pool) -> None:
    """The worker's own headers arriving on a message (forged, or stale: Celery copies them
    into a retry's message) never steer a start or hold back an ack."""
    pool = live_pool
    forged = {"interval_start_ns": 2**62, "interval_spin_ns": -5, "interval_ticket": "x"}
    # Sent once per id (as a redelivery is the same send): the copy below is a duplicate.
    once = {"interval_send": "once"}
    first = pool.app.send_task("workerapp.record", args=(0,), queue=pool.queue, headers=once).id
    fresh = pool.app.send_task("workerapp.record", args=(1,), queue=pool.queue, headers=forged)
    ran = _wait_ids(pool, [first, fresh.id], timeout_s=10)
    assert_exactly_once(ran, [first, fresh.id])
    assert all(isinstance(r["ticket"], int) for r in ran), "a forged ticket was kept"
    time.sleep(0.5)  # the done marks reach the store
    # A copy of a finished task is dropped as a duplicate: its ack must not wait for 2**62 ns.
    pool.app.send_task(
        "workerapp.record", args=(0,), queue=pool.queue, headers={**forged, **once}, task_id=first
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _broker_backlog(pool) != (0, 0):
        time.sleep(0.1)
    time.sleep(1.0)
    assert _broker_backlog(pool) == (0, 0), "a message is stuck unacknowledged"
    assert_exactly_once(_wait_ids(pool, [first, fresh.id]), [first, fresh.id])


# -- worker start with bad settings, or with its store down --------------------------------

START_ROWS: list[tuple[str, dict[str, Any], str]] = [
    ("interval-0", {"interval_s": 0}, "interval_queues['{q}']=0.0: an interval must be finite"),
    ("interval-negative", {"interval_s": -1}, "interval_queues['{q}']=-1.0: an interval must"),
    ("interval-nan", {"interval_s": math.nan}, "interval_queues['{q}']=nan: an interval must"),
    ("interval-inf", {"interval_s": math.inf}, "interval_queues['{q}']=inf: an interval must"),
    ("store-no-scheme", {"store": "redis//x"}, "interval store URL 'redis//x' has no scheme"),
    ("store-bad-port", {"store": "redis://host:notaport"},
     "malformed interval store URL 'redis://host:notaport': bad host or port"),
    ("store-ftp", {"store": "ftp://x"}, "interval store URL 'ftp://x' has unknown scheme 'ftp'"),
    ("store-empty", {"store": ""}, "interval_store_url='': expected a URL string"),
    ("store-encoding", {"store": "redis://127.0.0.1:1/0?encoding=latin-1"},
     "encoding=latin-1: the store's keys and scripts are UTF-8"),
    ("setting-typo", {"conf": {"interval_lease": 3}},
     "interval_lease=3: not a setting; did you mean 'interval_lease_s'?"),
    ("declaration-typo", {"conf": {"interval_queues": {"mail": {"interval": 1, "burts": 2}}}},
     "interval_queues['mail']: unknown option 'burts'; did you mean 'burst'?"),
    ("task-interval-fast", {"env_extra": {"CI_TEST_TASK_INTERVAL": "fast"}},
     "workerapp.own_interval.interval='fast': not an interval; give seconds between starts"),
    ("task-interval-0", {"env_extra": {"CI_TEST_TASK_INTERVAL": "0"}},
     "workerapp.own_interval.interval='0': an interval must be finite and > 0"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "expected"), [r[1:] for r in START_ROWS], ids=[r[0] for r in START_ROWS]
)
def test_worker_refuses_to_start_with_bad_settings(
    make_pool: Any, redis_server: RedisProc, options: dict[str, Any], expected: str
) -> None:
    """The worker exits with a line naming the setting; the tasks wait in the broker."""
    options = dict(options)
    interval_s = options.pop("interval_s", INTERVAL_S)
    pool = make_pool(interval_s, broker="redis", record_url=redis_server.url_for(5), **options)
    ids = pool.send(3)
    with pytest.raises(RuntimeError, match="exited early"):
        pool.start(1)
    log = pool.workers[0].log()
    expected = expected.format(q=pool.queue)
    lines = [ln for ln in log.splitlines() if "ConfigurationError" in ln and expected in ln]
    assert lines, log[-2000:]
    with pool.app.connection_for_read() as conn:
        depth = conn.default_channel.queue_declare(pool.queue, passive=True).message_count
    assert depth == len(ids), "tasks were taken from the broker by a worker that cannot run"


@pytest.mark.slow
def test_unreachable_store_at_worker_start_holds_tasks(
    make_pool: Any, redis_server: RedisProc
) -> None:
    """A store on a closed port: the worker starts, logs one line naming the URL, runs no
    interval task; once the store comes up every task runs once, spaced."""
    store = RedisProc()
    store.kill()  # its port is closed now; restart() brings it back there, empty
    try:
        pool = make_pool(INTERVAL_S, broker="redis", store=store.url, record_url=redis_server.url)
        pool.recorder.delete(f"record:{pool.queue}")
        worker = pool.start(1)[0]
        ids = pool.send(20)
        time.sleep(3.0)
        assert pool.records() == [], "an interval task ran while its store was down"
        assert worker.proc.poll() is None
        store.restart()
        records = pool.wait_records(20, timeout_s=60)
    finally:
        store.stop()
    assert_exactly_once(records, ids)
    deadlines = sorted(r["deadline_ns"] // 1000 for r in records)
    assert min(b - a for a, b in itertools.pairwise(deadlines)) >= body_floor_us(INTERVAL_S)
    lines = [ln for ln in worker.log().splitlines() if "interval store unreachable" in ln]
    assert len(lines) == 1 and store.url in lines[0], lines
    assert "interval store reachable again" in worker.log()


@pytest.mark.parametrize(
    ("send", "expected"),
    [(5, "interval_send=5: expected 8 hex digits"), ("xyz", "interval_send='xyz'"),
     ("0123456g", "expected 8 hex digits")],
)  # fmt: skip
def test_a_malformed_send_code_is_named(send: object, expected: str) -> None:
    """A message from a publisher that wrote its own ``interval_send`` (every publisher with
    celery_interval stamps a fresh one) fails with the header named."""
    from celery_interval.errors import ConfigurationError
    from celery_interval.placement import generation_of

    with pytest.raises(ConfigurationError, match=expected):
        generation_of({"interval_send": send, "retries": 1})


def test_send_codes_keep_sends_apart_and_once_keeps_the_id() -> None:
    from celery_interval.headers import stamp_send
    from celery_interval.placement import generation_of

    first, second, once = {"retries": 2}, {"retries": 2}, {"retries": 2, "interval_send": "once"}
    for headers in (first, second, once):
        stamp_send(headers=headers)
    assert generation_of(first) != generation_of(second)
    assert generation_of(first) & 0xFFFFF == 2 and generation_of(once) == 2
