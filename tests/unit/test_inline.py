"""``slot()``: starts for code that is not a task, from the bucket's budget, on a real Redis."""

from __future__ import annotations

import asyncio
import itertools
import re
import threading
import time
from typing import Any

import pytest
import redis
from celery import Celery

from celery_interval import ConfigurationError, SlotTimeout, slot
from celery_interval.app_store import store_of
from celery_interval.demo.embedded import RedisProc
from celery_interval.schedule import PLACE_SETTLE_US, Pace
from celery_interval.stores.base import TaskCopy
from tests.helpers.apps import INTERVAL_S, make_app
from tests.helpers.ledgers import starts_us


@pytest.fixture
def app(redis_server: RedisProc, redis_client: redis.Redis[Any]) -> Celery:
    return make_app(redis_server)


def test_inline_starts_are_spaced_by_the_interval_and_in_the_ledger(
    app: Celery, redis_client: redis.Redis[Any]
) -> None:
    tickets = []
    for _ in range(4):
        with slot(app, "api") as started:
            tickets.append(started.ticket)
    assert tickets == [1, 2, 3, 4]
    gaps = [b - a for a, b in itertools.pairwise(starts_us(redis_client))]
    assert len(gaps) == 3 and min(gaps) >= INTERVAL_S * 1e6, gaps


def test_a_wait_past_the_timeout_raises_at_once_and_takes_no_ticket(
    app: Celery, redis_client: redis.Redis[Any]
) -> None:
    store = store_of(app)
    for i in range(20):  # a backlog of tasks two seconds deep
        store.grant(TaskCopy("api", f"t{i}", 0), Pace(round(INTERVAL_S * 1e6)))
    # "no ticket was taken" is said only by a refusal at its first grant, before any wait;
    # how far the start is depends on how long a loaded machine took to grant the backlog
    with (
        pytest.raises(
            SlotTimeout, match=r"the next start is (\d+\.\d+)s away.*no ticket"
        ) as refused,
        slot(app, "api", timeout_s=0.5),
    ):
        pytest.fail("the block ran")
    away_s = float(re.search(r"(\d+\.\d+)s away", str(refused.value)).group(1))  # type: ignore[union-attr]
    assert away_s > 0.5
    assert store.status("api", round(INTERVAL_S * 1e6)).ticket == 20


def test_async_with_shares_the_budget(app: Celery, redis_client: redis.Redis[Any]) -> None:
    async def one() -> int:
        async with slot(app, "api") as started:
            return started.ticket

    async def three() -> list[int]:
        return list(await asyncio.gather(one(), one(), one()))

    assert sorted(asyncio.run(three())) == [1, 2, 3]
    gaps = [b - a for a, b in itertools.pairwise(starts_us(redis_client))]
    assert len(gaps) == 2 and min(gaps) >= INTERVAL_S * 1e6, gaps


def test_a_capped_bucket_counts_inline_bodies(
    redis_server: RedisProc, redis_client: redis.Redis[Any]
) -> None:
    """Cap 1: while one inline block runs, another cannot start; it times out naming the cap,
    and starts once the first block has ended (its place is freed at the block's end)."""
    app = make_app(redis_server, concurrency=1)
    store_of(app).grant(TaskCopy("warm", "w", 0), Pace(1_000))  # the store's birth
    time.sleep(PLACE_SETTLE_US / 1e6)
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with slot(app, "api"):
            inside.set()
            leave.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(10)
    full = pytest.raises(SlotTimeout, match="every place of the bucket's cap is taken")
    with full, slot(app, "api", timeout_s=0.5):
        pytest.fail("two bodies at once under cap 1")
    leave.set()
    holder.join(10)
    with slot(app, "api", timeout_s=2.0) as started:
        assert started.ticket == 3


def test_bad_arguments_are_refused_with_their_values(app: Celery) -> None:
    with pytest.raises(ConfigurationError, match=r"slot\(cost=...\)=0: expected an integer >= 1"):
        slot(app, "api", cost=0)
    with pytest.raises(ConfigurationError, match=r"timeout_s=...\) must be seconds >= 0 or None"):
        slot(app, "api", timeout_s=-1)
    with pytest.raises(ConfigurationError, match="exceeds the bucket's burst of 1"):
        slot(app, "api", cost=2)
    with pytest.raises(ConfigurationError, match="unknown interval bucket 'nope'"):
        slot(app, "nope")
