"""Redis Sentinel as the store: real sentinels, a master killed, its replica promoted."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.bin.celery import celery
from click.testing import CliRunner

from celery_interval.errors import StoreUnavailable
from celery_interval.schedule import ClaimTerms, Outcome, Pace
from celery_interval.schedule.state import MAX_LEAD_US
from celery_interval.stores import store_from_url
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.redis import RedisStore
from tests.helpers.failover import SentinelGroup, replica_behind, sentinel_group
from tests.helpers.store_exercise import exercise

LEASE_US = 30_000_000
DEDUPE_US = 3_600_000_000


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    with sentinel_group() as started:
        yield started


def _store(group: SentinelGroup) -> RedisStore:
    store = store_from_url(group.url)
    assert isinstance(store, RedisStore)
    return store


def _replicated(group: SentinelGroup) -> None:
    """Wait until the replica has every write the master acknowledged."""
    with contextlib.closing(redis.Redis(port=group.master.port)) as master:
        assert master.wait(1, 5000) == 1


def _until_served(call: Any, timeout_s: float = 30.0) -> tuple[Any, int]:
    """``call()`` retried while the store is unavailable; its result and the wall-clock µs just
    before the attempt that succeeded (no earlier than that attempt's write)."""
    deadline = time.monotonic() + timeout_s
    while True:
        tried_us = time.time_ns() // 1000
        try:
            return call(), tried_us
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_every_operation_on_the_sentinels_master(
    group: SentinelGroup, redis_server: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every store operation, the birth marker, and ``interval ledger export`` on the URL."""
    store = _store(group)
    exercise(store, "api")
    with contextlib.closing(redis.Redis(port=group.master.port)) as master:
        assert master.exists("ci:{~born}"), "the birth marker is kept as on a single Redis"
    store.close()
    monkeypatch.setenv("CLI_TEST_BROKER", redis_server.broker_url_for(4))
    monkeypatch.setenv("CLI_TEST_STORE", group.url)
    sys.modules.pop("tests.helpers.cliapp", None)
    out = tmp_path / "api.jsonl"
    result = CliRunner().invoke(
        celery,
        ["-A", "tests.helpers.cliapp:app", "interval", "ledger", "export", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "exported 10 entries of 1 buckets" in result.output
    assert out.read_text().count('"bucket":"api"') == 10


def test_the_store_follows_the_promoted_replica_with_its_state(group: SentinelGroup) -> None:
    """Every write reached the replica before the kill: the new master has the state, the
    marks and the birth marker; tickets go on in the same epoch."""
    store = _store(group)
    interval_us = 50_000
    first = store.grant(TaskCopy("b", "t1", 0), Pace(interval_us))
    time.sleep(first.delay_us / 1e6 + 0.005)
    assert (
        store.claim(
            TaskCopy("b", "t1", 0), interval_us, first.slot, ClaimTerms("h", LEASE_US)
        ).outcome
        is Outcome.OK
    )
    store.done([TaskCopy("b", "t1", 0)], DEDUPE_US)
    _replicated(group)
    group.master.kill()
    with pytest.raises(StoreUnavailable):
        store.status("b", interval_us)
    group.wait_promoted()
    second, _ = _until_served(lambda: store.grant(TaskCopy("b", "t2", 0), Pace(interval_us)))
    assert (second.epoch, second.ticket) == (first.epoch, 2)
    assert store.grant(TaskCopy("b", "t1", 0), Pace(interval_us)).outcome is Outcome.DUPLICATE
    with contextlib.closing(redis.Redis(port=group.replica.port)) as promoted:
        assert promoted.exists("ci:{~born}")
    store.close()


def test_writes_the_replica_missed_are_lost_and_the_fence_keeps_the_interval(
    group: SentinelGroup,
) -> None:
    """A take (grant and claim in one script) and a done mark acknowledged by the master while
    the replica lagged, then the master killed: the promoted replica never got them. The state
    rolls back to the last replicated write, in the same epoch (the birth marker and the state
    came through: no new epoch), so:

    - the lost done mark no longer marks its task: a copy of it would be granted and run;
    - the state was saved by another master: the new master fences it, so the next start
      comes one interval after the lost one at the earliest, though the failover (about 2.5 s,
      8 s with a split vote) was shorter than the interval. Unfenced, the new master would
      space it from the last start it knows, and admit it as soon as it serves.
    """
    store = _store(group)
    # longer than a failover with one split vote: down after 1 s, a second election after
    # twice the 3 s failover-timeout
    interval_us = 10_000_000
    terms = ClaimTerms("h", LEASE_US, lead_us=MAX_LEAD_US)
    with contextlib.closing(redis.Redis(port=group.master.port)) as master:
        master.set("ci:{~born}", 0)  # an old store: the first task starts at once
    one = store.take(TaskCopy("b", "t1", 0), Pace(interval_us), terms)[1]
    assert one is not None and one.outcome is Outcome.OK
    _replicated(group)
    time.sleep(interval_us / 1e6)
    with replica_behind(group.master, group.replica, "junk"):
        two = store.take(TaskCopy("b", "t2", 0), Pace(interval_us), terms)[1]
        assert two is not None and two.outcome is Outcome.OK
        store.done([TaskCopy("b", "t2", 0)], DEDUPE_US)
        group.master.kill()
    group.wait_promoted()
    (third, three), first_write_us = _until_served(
        lambda: store.take(TaskCopy("b", "t3", 0), Pace(interval_us), terms)
    )
    assert three is None, "fenced: t3's slot is an interval away, not due now"
    state = store.read_state("b")
    assert state is not None and state.epoch == one.epoch, "no new epoch: the state came through"
    starts = [f["task"] for _, f in store.ledger("b") if f["op"] == "claim:OK"]
    assert starts == ["t1"], "t2's take is lost"
    copy = store.grant(TaskCopy("b", "t2", 0), Pace(interval_us))
    assert copy.outcome is Outcome.OK, "the lost done mark does not mark its task any more"
    time.sleep(third.delay_us / 1e6)
    three = store.claim(TaskCopy("b", "t3", 0), interval_us, third.slot, terms)
    assert three.outcome is Outcome.OK
    lost_start_us = two.now_us + two.delay_us
    failover_us = first_write_us - two.now_us
    gap_us = three.now_us + three.delay_us - lost_start_us
    print(
        f"FIGURES sentinel lost writes: failover {failover_us / 1e6:.2f} s, "
        f"gap to the lost start {gap_us / 1e6:.2f} s, interval {interval_us / 1e6:.2f} s"
    )
    assert failover_us < interval_us, "the failover was not shorter than the interval"
    assert gap_us >= interval_us
    store.close()
