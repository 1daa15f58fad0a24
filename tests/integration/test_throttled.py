"""Throttled on real workers against a real limiting HTTP server: the whole pool backs off."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_interval.schedule.state import MAX_LEAD_US
from tests.helpers.assertions import assert_quiet, assert_spacing
from tests.helpers.ledgers import admitted_starts, ledger, throttle_entries
from tests.helpers.limiting import limiting_server
from tests.helpers.pool import Pool, celery_cli
from tests.helpers.pool_tasks import kinds

INTERVAL_S = 0.1  # ten calls a second: twice what the server allows
N = 8


@pytest.fixture
def api() -> Iterator[Any]:
    """A real HTTP server allowing 5 calls a second (burst 1): 429 with Retry-After beyond."""
    with limiting_server().LimitingServer(rate=5, burst=1) as server:
        yield server


def send(pool: Pool, task: str, url: str) -> list[str]:
    return [pool.app.send_task(task, args=(i, url), queue=pool.queue).id for i in range(N)]


#: The ledger fields printed when a kept place was passed.
PRINTED = (
    "op",
    "now",
    "task",
    "holder",
    "start",
    "again",
    "readmit",
    "moved",
    "missed",
    "retry_after",
)


def assert_kept_places(
    starts: list[dict[str, Any]],
    entries: list[dict[str, Any]],
    oks: list[dict[str, str]],
    story: str,
) -> None:
    """Each throttled task keeps its place: between its throttle and its next start, the only
    starts are of tasks throttled before it that had not run again yet (their kept slots come
    first, in the order of the throttles). A copy that claimed its kept slot only after it had
    passed (a loaded worker) is passed by the starts admitted meanwhile, as the docs say, but
    never by one within an interval of its kept slot (the store holds every other claim an
    interval past the last kept slot)."""

    def next_start(task: str, after_us: int) -> int | None:
        return min(
            (r["us"] for r in starts if r["id"] == task and r["us"] > after_us), default=None
        )

    for throttle in entries:
        now_us = int(throttle["now"])
        own_us = next_start(throttle["task"], now_us)
        if own_us is None:  # it ran again after the records were read
            continue
        pending = set()
        for earlier in entries:
            if int(earlier["now"]) < now_us:
                again_us = next_start(earlier["task"], int(earlier["now"]))
                if again_us is None or again_us > now_us:
                    pending.add(earlier["task"])
        admitted_us = now_us + MAX_LEAD_US
        passed_from_us = own_us
        own = next(e for e in oks if e["task"] == throttle["task"] and int(e["start"]) == own_us)
        kept_us = own_us - int(own.get("late", 0))  # the kept slot, on the store's clock
        if int(own["now"]) > kept_us:  # the copy came after its slot: later starts may pass
            passed_from_us = min(own_us, kept_us + int(own["interval"]))  # it, an interval on
        strays = [
            r for r in starts if admitted_us < r["us"] < passed_from_us and r["id"] not in pending
        ]
        if strays:  # printed whole: an assertion's message is cut short
            print(f"throttle {throttle}\nown {own}\npending {sorted(pending)}")
            print(f"strays {strays}\n{story}")
        assert not strays, f"{throttle['task'][:8]}'s kept place passed by {len(strays)} start(s)"


@pytest.mark.slow
@pytest.mark.parametrize("task", ["workerapp.call_api", "workerapp.call_api_late"])
def test_a_429_defers_the_whole_pool_and_the_throttled_task_keeps_its_place(
    make_pool: Any, api: Any, task: str
) -> None:
    pool = make_pool(INTERVAL_S, broker="redis")
    pool.start(2, concurrency=2)
    ids = send(pool, task, api.url + "/call")
    deadline = time.monotonic() + 120
    while len(kinds(pool, "ok")) < N and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # a stray second success would come within this
    oks, starts, throttles = kinds(pool, "ok"), kinds(pool, "start"), kinds(pool, "throttled")
    t0 = starts[0]["us"] if starts else 0
    story = "\n".join(
        f"{(r['us'] - t0) / 1e6:8.3f} {r['kind']:9} {r['id'][:8]} ticket={r['ticket']} {r['host']}"
        for r in sorted(pool.records(), key=lambda r: r["us"])
    )

    # every task succeeded once; none is lost, none called the API twice with success
    assert sorted(r["id"] for r in oks) == sorted(ids)
    assert throttles, "the server never said 429: the test did not test anything"
    # a throttled task is sent again as the same retry: its retry budget is untouched
    assert {r["retries"] for r in starts} == {0}
    entries = throttle_entries(pool)
    assert len(entries) == len(throttles)  # one ledger entry per 429
    assert all(r["args"][1] >= 1 for r in throttles)  # whole seconds of Retry-After, at least 1
    assert_quiet(admitted_starts(pool), entries)
    try:
        oks_ledger = [e for e in ledger(pool) if e["op"] == "claim:OK"]
        assert_kept_places(admitted_starts(pool), entries, oks_ledger, story)
    except AssertionError:  # the ledger's word on each task: which path admitted the strays
        for e in ledger(pool):
            print({k: e[k] for k in PRINTED if k in e})
        raise
    # every start (of a first run or a throttled one's next) kept the interval
    assert_spacing(pool, starts, INTERVAL_S)
    stats = json.loads(_get(api.url + "/admin/stats"))
    assert stats["totals"]["accepted"] == N, stats["totals"]


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as reply:
        return str(reply.read().decode())


@pytest.mark.slow
def test_workers_killed_with_a_throttle_outstanding_lose_nothing(make_pool: Any, api: Any) -> None:
    """SIGKILL the worker of each of the first two throttled runs (acks_late, RabbitMQ: its
    unacked messages come back at once): every task still succeeds once, and no start falls
    inside a throttle's wait."""
    pool = make_pool(INTERVAL_S, broker="rabbitmq", conf={"interval_lease_s": 3.0})
    workers = {w.name: w for w in pool.start(3, concurrency=2)}
    ids = send(pool, "workerapp.call_api_late", api.url + "/call")
    killed: list[str] = []
    deadline = time.monotonic() + 180
    while len({r["id"] for r in kinds(pool, "ok")}) < N and time.monotonic() < deadline:
        for throttle in kinds(pool, "throttled"):
            host = throttle["host"]
            if len(killed) < 2 and host not in killed and host in workers:
                pool.kill(workers.pop(host))
                killed.append(host)
        time.sleep(0.1)
    time.sleep(1.0)
    assert len(killed) == 2, "fewer than two throttles: the test did not test anything"
    oks = kinds(pool, "ok")
    assert sorted(r["id"] for r in oks) == sorted(ids), "a task was lost or succeeded twice"
    assert_quiet(admitted_starts(pool), throttle_entries(pool))


@pytest.mark.slow
def test_an_adaptive_bucket_slows_to_the_server_and_says_so(make_pool: Any, api: Any) -> None:
    """An adaptive bucket: the 429s lengthen the interval for the whole pool (the status and
    the ledger say it is adapted); the calls the server accepted stay spaced by it."""
    queue = f"q{uuid.uuid4().hex[:10]}"
    pool = make_pool(
        INTERVAL_S,
        broker="redis",
        queue=queue,
        conf={"interval_queues": {queue: {"adaptive": True}}},
    )
    pool.start(2, concurrency=2)
    ids = send(pool, "workerapp.call_api", api.url + "/call")
    deadline = time.monotonic() + 120
    while len(kinds(pool, "ok")) < N and time.monotonic() < deadline:
        time.sleep(0.2)
    assert sorted(r["id"] for r in kinds(pool, "ok")) == sorted(ids)
    throttles = kinds(pool, "throttled")
    assert throttles
    status = celery_cli(pool, "interval", "status", queue, "--json")
    (row,) = json.loads(status.stdout)["queues"]
    assert row["adapted"] is True and row["interval_s"] > INTERVAL_S, row
    adapted = [int(e["interval"]) for e in throttle_entries(pool, queue)]
    assert len(adapted) == len(throttles) and {
        e["adapted"] for e in throttle_entries(pool, queue)
    } == {"1"}
    assert adapted == sorted(adapted) and adapted[0] > INTERVAL_S * 1e6  # each one slower
    assert_spacing(pool, kinds(pool, "start"), INTERVAL_S)


@pytest.mark.slow
def test_the_store_restarted_empty_with_a_throttle_outstanding(
    make_pool: Any, api: Any, redis_server: Any
) -> None:
    """The store killed right after the first 429 and back empty (a new epoch: the throttle and
    the kept place are forgotten, a throttle meeting the outage sends its task again with a
    countdown): every task still succeeds exactly once."""
    from celery_interval.demo.embedded import RedisProc

    store = RedisProc()
    try:
        pool = make_pool(
            INTERVAL_S, broker="rabbitmq", store=store.url, record_url=redis_server.url_for(5)
        )
        pool.recorder.delete(f"record:{pool.queue}")
        pool.start(2, concurrency=2)
        ids = send(pool, "workerapp.call_api_late", api.url + "/call")
        deadline = time.monotonic() + 60
        while not kinds(pool, "throttled") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert kinds(pool, "throttled"), "the server never said 429: nothing was tested"
        store.kill()
        time.sleep(1.5)
        store.restart()  # same port, empty
        deadline = time.monotonic() + 120
        while len(kinds(pool, "ok")) < N and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # a second success would come within this
    finally:
        store.stop()
    story = [(r["kind"], r["id"][:8]) for r in sorted(pool.records(), key=lambda r: r["us"])]
    assert sorted(r["id"] for r in kinds(pool, "ok")) == sorted(ids), story
