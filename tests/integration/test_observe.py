"""What onlookers see of interval tasks on real workers: events, inspect, status and the banner."""

from __future__ import annotations

import itertools
import json
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from tests.helpers.assertions import assert_exactly_once
from tests.helpers.events import receiving
from tests.helpers.ledgers import claim_times_us
from tests.helpers.pool import Pool, celery_cli

INTERVAL_S = 0.1
N = 30
PAUSED_N = 10


def wait_for(check: Callable[[], bool], timeout_s: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what or check}")


def by_task(events: list[dict[str, Any]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    out: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for event in list(events):
        if "uuid" in event:
            out[event["uuid"]][event["type"]].append(event)
    return out


def held_now(pool: Pool) -> dict[str, int]:
    """Each worker's held tasks of the pool's queue, as ``inspect interval_stats`` says."""
    replies = pool.app.control.broadcast(
        "interval_stats",
        arguments={"top": 0, "tasks": 0},
        reply=True,
        limit=len(pool.workers),
        timeout=10.0,
    )
    return {w: s.get(pool.queue, {}).get("held", 0) for r in replies for w, s in r.items()}


@pytest.mark.slow
@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_events_inspect_and_status_show_every_interval_task(make_pool: Any, broker: str) -> None:
    pool = make_pool(INTERVAL_S, broker=broker, loglevel="INFO")
    pool.start(2, args=("-E",))
    with receiving(pool) as events:
        ids = pool.send(N)
        records = pool.wait_records(N)
        assert_exactly_once(records, ids)
        claims = claim_times_us(pool)  # exact on the store's clock (events are what this tests)
        assert min(b - a for a, b in itertools.pairwise(claims)) >= INTERVAL_S * 1e6
        wait_for(
            lambda: all("task-succeeded" in by_task(events)[i] for i in ids),
            what="a task-succeeded event of every task",
        )
        seen = by_task(events)
        starts_s = {r["id"]: r["us"] / 1e6 for r in records}
        for n, task_id in enumerate(ids):
            kinds = seen[task_id]
            for kind in ("task-received", "task-started", "task-succeeded"):
                assert len(kinds[kind]) == 1, (task_id, kind, dict(kinds))
            received = kinds["task-received"][0]
            assert received["name"] == "workerapp.record"
            assert received["args"] == f"({n},)"
            assert received["timestamp"] <= kinds["task-started"][0]["timestamp"]
            # each grant names the slot; the body starts at it, never before
            granted = kinds["interval-granted"]
            assert granted and granted[-1]["bucket"] == pool.queue, dict(kinds)
            slot_s = datetime.fromisoformat(granted[-1]["eta"]).timestamp()
            assert starts_s[task_id] >= slot_s - 0.01, (task_id, starts_s[task_id], slot_s)
            assert received["eta"] in (None, *(g["eta"] for g in granted))
            assert [c["outcome"] for c in kinds["interval-claimed"]][-1] == "OK"
            calls = [e for e in granted + kinds["interval-claimed"] if "store_s" in e]
            assert calls and all(0 <= e["store_s"] < 5 for e in calls), calls
            assert {e["store_op"] for e in calls} <= {"grant", "take", "claim"}

        paused = celery_cli(pool, "control", "pause_queue", pool.queue, "--timeout", "2")
        assert paused.returncode == 0, paused.stderr
        wait_for(
            lambda: sum(e["type"] == "interval-paused" for e in events) == 2,
            what="an interval-paused event from each worker",
        )
        more = pool.send(PAUSED_N)
        wait_for(lambda: sum(held_now(pool).values()) > 0, what="held tasks while paused")
        time.sleep(1.0)  # every worker has taken what it will hold
        held = held_now(pool)

        status = celery_cli(pool, "interval", "status", pool.queue, "--json")
        assert status.returncode == 0, status.stderr
        (row,) = json.loads(status.stdout)["queues"]
        assert row["paused"] is True
        assert row["held"] == held, (row, held)
        assert row["held_total"] + row["broker_depth"] + row["parked"] == PAUSED_N, row

        listed = celery_cli(pool, "inspect", "scheduled", "--json", "--timeout", "2")
        assert listed.returncode == 0, listed.stderr
        scheduled = [
            entry
            for reply in json.loads(listed.stdout).values()
            for entry in reply
            if entry.get("interval", {}).get("bucket") == pool.queue
        ]
        assert {e["request"]["id"] for e in scheduled} <= set(more), scheduled
        assert len(scheduled) == sum(held.values()), (scheduled, held)
        assert {e["interval"]["state"] for e in scheduled} <= {"queued", "granted", "paused"}

        resumed = celery_cli(pool, "control", "unpause_queue", pool.queue, "--timeout", "2")
        assert resumed.returncode == 0, resumed.stderr
        records = pool.wait_records(N + PAUSED_N)
        assert_exactly_once(records, ids + more)

    status = celery_cli(pool, "interval", "status", pool.queue, "--json")
    (row,) = json.loads(status.stdout)["queues"]
    assert row["broker_depth"] == 0, row  # an empty queue (no key at all on a Redis broker)
    for worker in pool.workers:
        log = worker.log()
        assert "[interval queues]" in log
        assert f". {pool.queue}: 0.1s (one start every 0.1 s = 10/s)" in log
        assert f"interval: control pause_queue {pool.queue}: interval 0.1s, paused" in log, log
        assert f"interval: control unpause_queue {pool.queue}: interval 0.1s, running" in log
