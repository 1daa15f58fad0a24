"""``slot()`` beside real workers: inline starts and task starts share one bucket's budget."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest

from celery_interval import slot
from tests.helpers.assertions import assert_exactly_once
from tests.helpers.ledgers import claim_times_us

pytestmark = pytest.mark.slow

INTERVAL_S = 0.05


def test_inline_callers_and_tasks_share_the_interval(make_pool: Any) -> None:
    """Two workers run 40 tasks while two threads of this process (a web app, say) take 10
    inline starts of the same queue: every start, task or inline, is one interval or more
    after the one before it on the store's clock, and every task runs once."""
    pool = make_pool(INTERVAL_S)
    pool.start(2, concurrency=2)
    ids = pool.send(40)
    tickets: list[int] = []

    def caller() -> None:
        for _ in range(5):
            with slot(pool.app, pool.queue, timeout_s=30) as started:
                tickets.append(started.ticket)

    threads = [threading.Thread(target=caller) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    records = pool.wait_records(40)
    assert_exactly_once(records, ids)
    assert len(tickets) == 10 and len(set(tickets)) == 10
    starts = claim_times_us(pool)
    assert len(starts) >= 50
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= round(INTERVAL_S * 1e6), f"two starts {min(gaps)}us apart"
