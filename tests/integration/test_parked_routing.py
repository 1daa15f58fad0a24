"""A task taken back from its overflow queue looks as it did before it was parked: what Celery
derives from the delivery (a retry's queue) names the task's own queue, never the overflow's."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.assertions import assert_exactly_once

pytestmark = pytest.mark.slow

TASKS = 40


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_a_parked_task_that_retries_goes_back_to_its_own_queue(make_pool: Any, broker: str) -> None:
    """Declared queues only (``task_queues`` + ``task_create_missing_queues = False``), a worker
    that holds 2: 38 of 40 tasks park, and each task retries once from its body. Every retry is
    sent to the task's own queue and runs: 40 first runs and 40 second runs, each once."""
    pool = make_pool(
        0.01,
        broker=broker,
        conf={"interval_max_held": 2, "interval_max_held_total": 2},
        env_extra={"CI_TEST_DECLARED_QUEUES": "1"},
    )
    pool.recorder.flushdb()
    pool.start(1, concurrency=2)
    ids = pool.send(TASKS, fail_times=1)
    records = pool.wait_records(2 * TASKS, timeout_s=60.0)
    first = [r for r in records if r["retries"] == 0]
    second = [r for r in records if r["retries"] == 1]
    assert_exactly_once(first, ids)
    assert_exactly_once(second, ids)
    failures = pool.recorder.lrange(f"failure:{pool.queue}", 0, -1)
    assert not failures, failures[:3]
    assert "QueueNotFound" not in pool.workers[0].log()
