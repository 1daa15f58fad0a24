"""The concurrency cap on real workers: never more bodies at once than the cap, kept busy."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from celery_interval.demo.embedded import RedisProc
from tests.helpers.assertions import assert_exactly_once
from tests.helpers.pool import celery_cli

pytestmark = pytest.mark.slow

BODY_S = 0.3


def spans(records: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """(start, end) of each body that ended, on the store's clock, by task id."""
    starts = {r["id"]: r["us"] for r in records if r["kind"] == "start"}
    return {r["id"]: (starts[r["id"]], r["us"]) for r in records if r["kind"] == "end"}


def most_at_once(intervals: list[tuple[int, int]]) -> int:
    """The most intervals that overlap at any instant."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def longest_short_spell_us(intervals: list[tuple[int, int]], cap: int) -> int:
    """The longest spell, from the first start to the last, with fewer than ``cap`` running."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    last_start = max(s for s, _ in intervals)
    running, since, longest = 0, None, 0
    for at, step in edges:
        if at > last_start:
            break
        running += step
        if running < cap and since is None:
            since = at
        elif running >= cap and since is not None:
            longest, since = max(longest, at - since), None
    return longest


def capped_pool(make_pool: Any, cap: int, **conf: Any) -> Any:
    queue = f"q{uuid.uuid4().hex[:10]}"
    return make_pool(
        0.01, queue=queue, conf={"interval_queues": {queue: {"concurrency": cap}}, **conf}
    )


def test_three_workers_never_run_more_bodies_than_the_cap(make_pool: Any) -> None:
    """3 workers x 2 processes, cap 2, bodies of 0.3 s: at no instant more than 2 bodies, every
    task once, and the cap kept busy: a freed place is taken again within a second (a place
    left to expire would idle for the lease, 30 s)."""
    pool = capped_pool(make_pool, 2)
    pool.start(3, concurrency=2)
    n = 16
    ids = pool.send(n, task="workerapp.span", sleep_s=BODY_S)
    pool.wait_records(n, kind="end")
    records = pool.records()
    assert_exactly_once([r for r in records if r["kind"] == "start"], ids)
    bodies = list(spans(records).values())
    assert len(bodies) == n
    assert most_at_once(bodies) <= 2, sorted(bodies)
    took_s = (max(e for _, e in bodies) - min(s for s, _ in bodies)) / 1e6
    idle_s = longest_short_spell_us(bodies, 2) / 1e6
    print(f"CAP 2: {n} bodies of {BODY_S}s in {took_s:.2f}s, a place idle {idle_s:.3f}s at most")
    assert idle_s < 1.0, f"a place idled {idle_s:.2f}s"


def test_a_killed_workers_place_comes_back_after_the_lease(make_pool: Any) -> None:
    """Cap 1: the worker running a body is SIGKILLed; no other body starts before its place
    expires (at least two thirds of ``interval_lease_s`` after the kill: it was renewed every
    third), then every task runs, the killed one again (acks_late), nothing lost. While it
    runs, ``interval status`` and ``interval_stats`` show its place."""
    lease_s = 3.0
    pool = capped_pool(make_pool, 1, interval_lease_s=lease_s)
    workers = pool.start(2, concurrency=1)
    (first,) = pool.send(1, task="workerapp.record_late", sleep_s=10)
    (started,) = pool.wait_records(1, kind="start")
    victim = next(w for w in workers if w.name == started["host"])
    # the running body's place is seen: by the store (status) and by the worker (inspect)
    shown = celery_cli(pool, "interval", "status", pool.queue, "--json", "--timeout", "2")
    assert shown.returncode == 0, shown.stderr
    (row,) = json.loads(shown.stdout)["queues"]
    assert (row["running"], row["cap"]) == (1, 1), row
    stats = pool.app.control.broadcast(
        "interval_stats",
        arguments={"buckets": [pool.queue]},
        reply=True,
        limit=len(workers),
        timeout=10,
    )
    running = {n: s.get(pool.queue, {}).get("running", 0) for r in stats for n, s in r.items()}
    assert running == {victim.name: 1, **{w.name: 0 for w in workers if w is not victim}}, stats
    killed_us, _ = pool.kill(victim)  # the last renewal came before the first signal
    assert not [r for r in pool.records() if r["kind"] == "end"], "the body ended before the kill"
    rest = pool.send(3, task="workerapp.record_late", sleep_s=0.1)
    pool.wait_records(3, kind="end", timeout_s=60)
    records = pool.records()
    after = [r for r in records if r["kind"] == "start" and r["us"] > killed_us]
    assert after, "nothing started after the kill"
    first_after_s = (min(r["us"] for r in after) - killed_us) / 1e6
    print(f"first start {first_after_s:.2f}s after the kill (lease {lease_s}s)")
    assert first_after_s >= lease_s * 2 / 3 - 0.05, f"a start {first_after_s:.2f}s after the kill"
    ended = {r["id"] for r in records if r["kind"] == "end"}
    assert set(rest) <= ended
    assert first in {r["id"] for r in after}, "the killed task's copy never ran again"
    assert most_at_once([s for s in spans(records).values()]) <= 1


def test_the_store_restarted_empty_while_capped_bodies_run(
    make_pool: Any, redis_server: Any
) -> None:
    """Cap 2, bodies of 1.5 s; the store is killed and restarted empty while two bodies run,
    losing their places. The running bodies take their places back at their next renewal and
    new claims wait for that (PLACE_SETTLE_US after the store's new birth): never more than 2
    bodies at once, every task once."""
    store = RedisProc()
    try:
        queue = f"q{uuid.uuid4().hex[:10]}"
        pool = make_pool(
            0.01,
            queue=queue,
            store=store.url,
            record_url=redis_server.url_for(5),
            conf={"interval_queues": {queue: {"concurrency": 2}}},
        )
        pool.start(3, concurrency=2)
        ids = pool.send(10, task="workerapp.span", sleep_s=1.5)
        pool.wait_records(4, kind="start", timeout_s=60)
        time.sleep(0.3)  # two bodies run, the two before them ended
        store.kill()
        time.sleep(0.3)
        store.restart()  # same port, empty: the places of the running bodies are gone
        pool.wait_records(10, kind="end", timeout_s=90)
        records = pool.records()
    finally:
        store.stop()
    assert_exactly_once([r for r in records if r["kind"] == "start"], ids)
    bodies = list(spans(records).values())
    assert len(bodies) == 10
    assert most_at_once(bodies) <= 2, sorted(bodies)
