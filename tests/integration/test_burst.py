"""A bucket's burst and tasks' costs on real workers: a burst after an idle spell, then the
interval; weighted costs keep Σ cost <= burst + span / interval on the store's clock."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from celery_interval.headers import COST_HEADER
from celery_interval.schedule import MAX_LEAD_US, Pace
from celery_interval.starts import happened
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.redis import RedisStore

pytestmark = pytest.mark.slow

INTERVAL_S = 0.2
INTERVAL_US = round(INTERVAL_S * 1e6)
BURST = 5


def ledger_starts(store: RedisStore, bucket: str) -> list[tuple[int, int, str]]:
    """(start on the store's clock, cost, task id) of every start the ledger admitted."""
    return sorted(
        (int(f["start"]), int(f.get("cost", 1)), f["task"])
        for f in happened(f for _, f in store.ledger(bucket, count=10_000))
    )


def ran(starts: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """The start each task ran at: its last one (a start admitted anew when the pool reached
    the task after its first, which then never happened, ``readmit``, replaces it)."""
    last = {task: (start_us, cost, task) for start_us, cost, task in starts}
    return sorted(last.values())


def assert_within_budget(starts: list[tuple[int, int, str]]) -> None:
    """For every window of starts: Σ cost <= burst + span / interval."""
    for i, (first_us, _, _) in enumerate(starts):
        total = 0
        for last_us, cost, _ in starts[i:]:
            total += cost
            assert total * INTERVAL_US <= BURST * INTERVAL_US + last_us - first_us, starts[i:]


def idle(store: RedisStore) -> None:
    """Let a whole budget come back (the store's birth marker set first: a store new at the
    first grant counts the burst as used then)."""
    store.grant(TaskCopy("warm-up", uuid.uuid4().hex, 0), Pace(INTERVAL_US))
    time.sleep(((BURST + 1) * INTERVAL_US + MAX_LEAD_US) / 1e6 + 0.05)


def send_weighed(pool: Any, costs: list[int], by_header: bool) -> list[str]:
    """``workerapp.weighed`` tasks: each cost in the message's header (as ``apply_async``'s
    ``interval_cost=`` stamps it), or left to the task option (the ``units`` kwarg)."""
    ids = []
    for i, cost in enumerate(costs):
        headers = {COST_HEADER: cost} if by_header else {}
        kwargs = {} if by_header else {"units": cost}
        result = pool.app.send_task(
            "workerapp.weighed", args=(i,), kwargs=kwargs, queue=pool.queue, headers=headers
        )
        ids.append(result.id)
    return ids


def test_a_burst_after_an_idle_spell_then_one_per_interval_and_weighted_costs(
    make_pool: Any,
) -> None:
    """Burst 5, interval 0.2 s, 2 workers x 3 processes. Ten tasks of cost 1 after an idle
    spell: five start back to back, the other five at the interval. After another idle spell,
    tasks of costs 3 and 2, then 4, 1, 5, 2 (from the header and from the task option): every
    window of the starts holds Σ cost <= 5 + span / 0.2 s on the store's clock, and 3 + 2 start
    back to back."""
    queue = f"q{uuid.uuid4().hex[:10]}"
    pool = make_pool(INTERVAL_S, queue=queue, conf={"interval_queues": {queue: {"burst": BURST}}})
    pool.start(2, concurrency=3)
    store = RedisStore.from_url(pool.store)
    idle(store)
    ids = send_weighed(pool, [1] * 10, by_header=False)
    pool.wait_records(10, timeout_s=60)
    admitted = ledger_starts(store, queue)
    assert_within_budget(admitted)  # every start the store admitted counts
    times = [s for s, _, _ in admitted]
    print("unit starts (ms):", [round((s - times[0]) / 1e3) for s in times])
    assert times[BURST - 1] - times[0] < INTERVAL_US, "the burst was not admitted back to back"
    # A body that reached its pool process too late after its start (a loaded host) claims a
    # new start, which the budget spaces like any other: it ran at its last one.
    unit = ran(admitted)
    assert sorted(t for _, _, t in unit) == sorted(ids), "every task started"
    took_us = unit[-1][0] - unit[0][0]
    assert took_us < (len(admitted) - BURST) * INTERVAL_US + 1_000_000, "too slow for a burst"

    idle(store)
    costs = [3, 2, 4, 1, 5, 2]
    weighed = send_weighed(pool, costs[:2], by_header=True)  # in either order: back to back
    pool.wait_records(10 + 2, timeout_s=60)
    weighed += send_weighed(pool, costs[2:3], by_header=True)
    weighed += send_weighed(pool, costs[3:], by_header=False)
    pool.wait_records(10 + len(costs), timeout_s=60)
    starts = ledger_starts(store, queue)
    assert_within_budget(starts)
    later = [s for s in starts if s[2] in weighed]
    cost_of = dict(zip(weighed, costs, strict=True))
    assert {(t, c) for _, c, t in later} == set(cost_of.items()), "the ledger's costs"
    print("weighed starts (ms, cost):", [(round((s - later[0][0]) / 1e3), c) for s, c, _ in later])
    assert later[1][0] - later[0][0] < INTERVAL_US, "3 + 2 units were not admitted back to back"
    span_s = (later[-1][0] - later[0][0]) / 1e6
    assert span_s >= (sum(c for _, c, _ in later) - BURST) * INTERVAL_S - 0.001
    replies = pool.app.control.broadcast(
        "interval_stats",
        arguments={"top": 0, "tasks": 0},
        reply=True,
        limit=len(pool.workers),
        timeout=10.0,
    )
    bursts = {s[queue]["burst"] for r in replies for s in r.values() if queue in s}
    assert bursts == {BURST}, replies
