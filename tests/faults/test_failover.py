"""Store failover with real workers: the master of the bucket killed mid-run, a replica promoted."""

from __future__ import annotations

import contextlib
import itertools
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
import redis

from celery_interval.config.table import KEY_PREFIX
from celery_interval.demo.embedded import RedisProc
from celery_interval.schedule.state import MAX_LEAD_US
from celery_interval.stores import store_from_url
from celery_interval.stores.keys import ledger_key, state_key
from celery_interval.stores.redis import RedisStore
from tests.helpers.assertions import assert_exactly_once, body_floor_us
from tests.helpers.failover import (
    cluster_url,
    replica_behind,
    replicated_cluster,
    sentinel_group,
    slot_owner,
    wait_cluster_promoted,
)
from tests.helpers.pool import Pool

pytestmark = pytest.mark.slow

INTERVAL_S = 0.05
TASKS = 100
#: How long the master goes on admitting starts the replica never gets (``replica_behind``).
LAG_S = 0.2
#: At most this much longer until a start admitted inside the lag is seen (seconds).
LAG_WAIT_S = 5.0
#: How far a start deadline may stray in mapping the store's clock to this host's monotonic
#: one (half a round trip to the store, with room for a slow one).
MAPPING_US = 2_000
#: How long a worker may take to stop after SIGTERM (Pool.stop's wait before it kills).
STOP_S = 20.0


def _ledger(url: str, bucket: str) -> list[dict[str, str]]:
    store = store_from_url(url)
    assert isinstance(store, RedisStore)
    try:
        entries: list[dict[str, str]] = []
        start = "-"
        while page := store.ledger(bucket, start):
            entries += [fields for _id, fields in page]
            start = "(" + page[-1][0]
        return entries
    finally:
        store.close()


def _gap_figures(gaps_us: list[int]) -> str:
    if not gaps_us:
        return "none"
    return f"min {min(gaps_us) / 1000:.2f} ms, median {statistics.median(gaps_us) / 1000:.2f} ms"


def run_through_a_failover(
    pool: Pool,
    url: str,
    fail: Callable[[], contextlib.AbstractContextManager[None]],
    name: str,
) -> None:
    """Two workers run ``TASKS`` tasks; after 30 starts ``fail()`` kills the bucket's master,
    then runs its block (which reads the time of the death), and returns once the replica is
    promoted. Asserts what a failover promises:
    every task starts exactly once, no start is admitted while no master serves the bucket,
    the new master fences the bucket (its first start comes an interval and MAX_LEAD_US after
    its first write), and no two start deadlines come closer than the interval allows."""
    pool.recorder.delete(f"record:{pool.queue}")
    workers = pool.start(2)
    ids = pool.send(TASKS)
    pool.wait_records(30, timeout_s=60)
    with fail():
        killed_ns, killed_us = time.monotonic_ns(), time.time_ns() // 1000
    records = pool.wait_records(TASKS, timeout_s=90)
    assert all(w.proc.poll() is None for w in workers), "a worker exited"
    assert_exactly_once(records, ids)

    entries = _ledger(url, pool.queue)
    claimed = {e["task"] for e in entries if e["op"] == "claim:OK"}
    lost = sorted(set(ids) - claimed)  # started, but the new master has no claim of them
    new_writes_us = [int(e["now"]) for e in entries if int(e["now"]) > killed_us]
    first_new_ns = killed_ns + (min(new_writes_us) - killed_us) * 1000
    deadlines = sorted(r["deadline_ns"] for r in records)
    old = [d for d in deadlines if d <= killed_ns + MAX_LEAD_US * 1000]
    new = [d for d in deadlines if d > killed_ns + MAX_LEAD_US * 1000]
    # The old master's last start was admitted at most MAX_LEAD_US ahead of its death; the new
    # master admits none before its first write.
    assert old and new and new[0] >= first_new_ns, (old[-1:], new[:1], first_new_ns)
    fence_ns = (round(INTERVAL_S * 1e6) + MAX_LEAD_US - MAPPING_US) * 1000
    assert new[0] - first_new_ns >= fence_ns, "the new master did not fence the bucket"
    gaps = [b - a for a, b in itertools.pairwise(deadlines)]
    across_us = (new[0] - old[-1]) // 1000
    print(
        f"FIGURES {name}: tasks={TASKS} started={len(records)} lost=0 doubled=0 "
        f"starts the new master lacks={len(lost)} "
        f"failover={(first_new_ns - killed_ns) / 1e9:.2f}s gap across={across_us / 1000:.0f} ms; "
        f"deadline gaps before: {_gap_figures([g // 1000 for g in gaps[: len(old) - 1]])}; "
        f"first 10 after: {_gap_figures([g // 1000 for g in gaps[len(old) : len(old) + 10]])}; "
        f"after: {_gap_figures([g // 1000 for g in gaps[len(old) :]])}"
    )
    assert min(gaps) >= body_floor_us(INTERVAL_S) * 1000
    epochs = {e["epoch"] for e in entries if "epoch" in e}
    assert len(epochs) == 1, f"the state came through the failover, yet epochs {epochs}"
    return None


@contextlib.contextmanager
def _lagging(
    master: RedisProc, replica: RedisProc, key: str, lag: bool, pool: Pool
) -> Iterator[None]:
    """With ``lag``, the replica behind for LAG_S, and longer (up to LAG_WAIT_S) until a task
    has started whose claim the master admitted inside the lag (its ledger, read on the master,
    says so): on a slow machine 0.2 s may pass without one, and then no admitted start is lost."""
    if not lag:
        yield
        return
    with replica_behind(master, replica, key):
        with contextlib.closing(redis.Redis(port=master.port, decode_responses=True)) as client:
            seconds, micros = client.time()
            since_id = f"{seconds * 1000 + micros // 1000 + 1}-0"
            time.sleep(LAG_S)
            deadline = time.monotonic() + LAG_WAIT_S
            while time.monotonic() < deadline and not (
                _admitted_since(client, pool.queue, since_id) & {r["id"] for r in pool.records()}
            ):
                time.sleep(0.05)
        yield


def _admitted_since(client: redis.Redis[str], bucket: str, since_id: str) -> set[str]:
    """The tasks whose claim ``client``'s server admitted at or after ledger id ``since_id``."""
    raw: Any = client.xrange(ledger_key(KEY_PREFIX, bucket), min=since_id)
    return _claimed(fields for _id, fields in raw)


def _claimed(entries: Iterable[dict[str, str]]) -> set[str]:
    return {e["task"] for e in entries if e["op"] == "claim:OK"}


@pytest.mark.parametrize("lag", [False, True], ids=["in-sync", "replica-behind"])
def test_sentinel_master_killed_mid_run(make_pool: Any, redis_server: Any, lag: bool) -> None:
    """``redis+sentinel://``: the master SIGKILLed mid-run; the sentinels promote the replica
    (down-after 1 s). ``replica-behind``: the replica misses the master's last 0.2 s of
    writes, so the starts admitted then are lost to the new master, which is asserted."""
    with sentinel_group() as group:
        pool = make_pool(
            INTERVAL_S, broker="redis", store=group.url, record_url=redis_server.url_for(9)
        )

        @contextlib.contextmanager
        def fail() -> Iterator[None]:
            with _lagging(group.master, group.replica, "junk", lag, pool):
                group.master.kill()
                yield
            group.wait_promoted()

        run_through_a_failover(
            pool, group.url, fail, f"test_sentinel_master_killed_mid_run[{_id(lag)}]"
        )
        if lag:
            _assert_some_starts_were_lost(group.url, pool)


def test_a_worker_stops_on_sigterm_when_no_sentinel_answers(
    make_pool: Any, redis_server: Any
) -> None:
    """Every sentinel and the master gone: the worker's store calls fail at once (each one
    asks every sentinel with the store's quick retry, not redis-py's seconds of backoff per
    sentinel, which held the event loop for a minute a call), so a warm shutdown completes."""
    with sentinel_group() as group:
        pool = make_pool(
            INTERVAL_S, broker="redis", store=group.url, record_url=redis_server.url_for(9)
        )
        (worker,) = pool.start(1)
        ids = pool.send(5)
        assert_exactly_once(pool.wait_records(len(ids)), ids)
    time.sleep(1.0)  # the worker's timers (parking polls every 0.25 s) call the store meanwhile
    worker.proc.send_signal(signal.SIGTERM)
    try:
        worker.proc.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {STOP_S} s after SIGTERM:\n{worker.log()[-3000:]}")


@pytest.mark.parametrize("lag", [False, True], ids=["in-sync", "replica-behind"])
def test_cluster_master_of_the_bucket_killed_mid_run(
    make_pool: Any, redis_server: Any, lag: bool
) -> None:
    """``redis+cluster://`` with a replica per master: the master owning the bucket's hash
    slot SIGKILLed mid-run; its replica takes over (node timeout 1 s)."""
    with replicated_cluster() as (masters, replicas):
        url = cluster_url(masters)
        pool = make_pool(INTERVAL_S, broker="redis", store=url, record_url=redis_server.url_for(9))
        owner = slot_owner(masters, state_key(KEY_PREFIX, pool.queue))

        @contextlib.contextmanager
        def fail() -> Iterator[None]:
            junk = f"{KEY_PREFIX}{{{pool.queue}}}"  # the bucket's slot, on its master
            with _lagging(masters[owner], replicas[owner], junk, lag, pool):
                masters[owner].kill()
                yield
            wait_cluster_promoted(replicas[owner])

        run_through_a_failover(
            pool, url, fail, f"test_cluster_master_of_the_bucket_killed_mid_run[{_id(lag)}]"
        )
        if lag:
            _assert_some_starts_were_lost(url, pool)


def _id(lag: bool) -> str:
    return "replica-behind" if lag else "in-sync"


def _assert_some_starts_were_lost(url: str, pool: Pool) -> None:
    """The lag really lost admitted starts, or the test proved nothing about lost writes."""
    claimed = _claimed(_ledger(url, pool.queue))
    started = {r["id"] for r in pool.records()}
    assert started - claimed, "no admitted start was lost: the replica was not behind"
