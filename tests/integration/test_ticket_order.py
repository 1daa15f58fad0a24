"""One worker starts its tickets in order even after a start admitted again: a task whose pool
process came late claims a new start after the last, which pushes every later ticket's start an
interval past its slot, so neighbouring tickets wait for the same start."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery import Celery

from celery_interval import IntervalTask
from celery_interval.demo.embedded import RedisProc
from celery_interval.testing import (
    assert_spaced,
    configure_app,
    ledger_starts,
    start_interval_worker,
)
from celery_interval.worker.process import started

pytestmark = pytest.mark.slow

#: How late the chosen task's pool thread reaches its start: past the miss threshold (3 ms),
#: so it claims a new start.
LATE_S = 0.02


def test_a_late_pool_thread_leaves_the_later_tickets_in_order(
    redis_server: RedisProc, redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    interval_s, n, rounds = 0.1, 8, 3
    app = Celery("order_probe", set_as_current=False)
    app.conf.interval_queues = {"order": interval_s}
    app.conf.task_default_queue = "order"
    late: set[str] = set()
    before_body = started.before_body

    def late_before_body(app: Any, request: Any) -> None:
        if request.id in late:
            time.sleep(LATE_S)
        before_body(app, request)

    monkeypatch.setattr(started, "before_body", late_before_body)

    @app.task(base=IntervalTask, name="order_probe.body", shared=False)
    def body(i: int) -> int:
        return i

    configure_app(app, redis_server.url)
    sent: list[str] = []
    with start_interval_worker(app, pool="threads"):
        for _ in range(rounds):
            results = [body.delay(i) for i in range(n)]
            late.add(results[1].id)
            assert [r.get(timeout=60) for r in results] == list(range(n))
            sent += [r.id for r in results]
    starts = ledger_starts(app, "order")
    assert_spaced(starts, interval_s)
    readmitted = {s.task_id for s in starts if s.readmit}
    assert late <= readmitted, "each late task was admitted again"
    # A missed start moved to the readmit's time keeps its place in the order; one a later
    # start passed stays in its place, its readmit comes after.
    assert list(dict.fromkeys(s.task_id for s in starts)) == sent
