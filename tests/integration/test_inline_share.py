"""``slot()`` with an interactive share beside real workers running a backlog: each inline
start comes within its share's bound, where without the share it would wait behind the
backlog; every start, task or inline, an interval apart on the store's clock."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest

from celery_interval import slot
from tests.helpers.assertions import assert_exactly_once
from tests.helpers.ledgers import claim_times_us

pytestmark = pytest.mark.slow

INTERVAL_S = 0.05
SHARE = 0.25
TASKS = 300
CALLS = 10
#: Pool processes per worker: a worker takes a ticket per free process, so the granted
#: tickets a plain slot() queues behind are about as many as the fleet's processes (20).
CONCURRENCY = 10
#: One call right after another waits, on the store's clock from its grant to its admitted
#: start, for the share (interval / share) and the next start the budget allows after it (an
#: interval), plus the ledger's millisecond.
BOUND_S = INTERVAL_S / SHARE + INTERVAL_S + 0.001
#: Starts before the calls: two per pool process, so every process has run a task and takes a
#: ticket again when it is free (a process's first task can be slow, and the line thin meanwhile).
WARM_STARTS = 2 * 2 * CONCURRENCY


def inline_waits_s(pool: Any) -> list[float]:
    """Each inline start's wait on the store's clock, in start order: from its last grant
    (the ledger entry's millisecond) to its admitted start."""
    from celery_interval.config import settings_of
    from celery_interval.stores.keys import ledger_key

    key = ledger_key(settings_of(pool.app).key_prefix, pool.queue)
    granted_ms: dict[bytes, int] = {}
    waits: list[tuple[int, float]] = []
    for entry_id, fields in pool.recorder.xrange(key):
        task = fields.get(b"task", b"")
        if not task.startswith(b"inline-"):
            continue
        op = fields.get(b"op", b"")
        if op.startswith(b"grant:"):
            granted_ms[task] = int(entry_id.split(b"-")[0])
        elif op == b"claim:OK":
            start_us = int(fields[b"start"])
            waits.append((start_us, (start_us - granted_ms[task] * 1000) / 1e6))
    return [wait_s for _, wait_s in sorted(waits)]


def test_inline_starts_keep_their_share_beside_a_task_backlog(make_pool: Any) -> None:
    """Two workers of 10 processes run 300 tasks at 50 ms. During the backlog this process
    (a web app, say) takes 4 starts with a plain slot(), one after another, then 10 with a
    share of 0.25: the plain ones wait behind the granted tickets (about one per process),
    three of four at least longer than the bound, each shared one at most BOUND_S (waits on
    the store's clock, from each call's last grant to its start: a loaded caller that wakes
    late and asks again is not the store's wait). Every task runs once, and the ledger has
    every start an interval or more after the one before."""
    queue = f"q{uuid.uuid4().hex[:10]}"
    pool = make_pool(
        INTERVAL_S, queue=queue, conf={"interval_queues": {queue: {"interactive_share": SHARE}}}
    )
    plain = pool.app_factory(pool.broker, pool.store, pool.queue, INTERVAL_S)
    pool.start(2, concurrency=CONCURRENCY)
    ids = pool.send(TASKS)
    interval_us = round(INTERVAL_S * 1e6)
    pool.wait_records(WARM_STARTS, timeout_s=30)  # the backlog runs, a ticket per free process

    for app, calls in ((plain, 4), (pool.app, CALLS)):
        for _ in range(calls):
            with slot(app, queue, timeout_s=30):
                pass
    waits = inline_waits_s(pool)
    assert len(waits) == 4 + CALLS, waits
    plain_s, shared_s = waits[:4], waits[4:]
    print(f"INLINE waits on the store's clock (s): plain {plain_s}, shared {shared_s}")
    ran = sum(1 for record in pool.records() if record["kind"] == "start")
    records = pool.wait_records(TASKS, timeout_s=60)
    assert_exactly_once(records, ids)
    assert ran < TASKS, "the calls came during the backlog"
    assert max(shared_s) <= BOUND_S, shared_s
    assert sorted(plain_s)[1] > BOUND_S, plain_s
    starts = claim_times_us(pool)
    assert len(starts) >= TASKS + CALLS + 4
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= interval_us, f"two starts {min(gaps)}us apart"
