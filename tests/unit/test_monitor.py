"""The exporter's incremental figures: starts, violations, lateness and trimmed entries, from
hand-made ledgers, ledgers the store's scripts wrote, and the same rule as the demo's figures."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_interval.demo.embedded import RedisProc
from celery_interval.demo.report import figures_from
from celery_interval.errors import StoreUnavailable
from celery_interval.ledger import LedgerReader
from celery_interval.monitor import tail as tail_module
from celery_interval.monitor.histogram import LATENESS_BOUNDS_S, Histogram
from celery_interval.monitor.pages import read_pages
from celery_interval.monitor.tail import BATCH_BUCKETS, Cursor, LedgerTail
from celery_interval.monitor.tally import BucketTally
from celery_interval.schedule import ClaimTerms, Outcome, Pace
from celery_interval.starts import is_start
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.redis import RedisStore
from tests.helpers.brokers import skip_or_fail
from tests.helpers.clusters import (
    cluster_client_of,
    flush,
    ledger_buckets_per_master,
    three_masters,
)
from tests.helpers.fakeclock import Clock
from tests.helpers.hand_entries import I_US, T0, claim_ok, grant_ok


def fed(entries: list[dict[str, str]]) -> BucketTally:
    tally = BucketTally()
    for fields in entries:
        tally.feed(fields)
    return tally


def test_starts_violations_and_lateness_of_a_hand_made_ledger() -> None:
    tally = fed(
        [
            grant_ok("a"),
            grant_ok("b"),
            grant_ok("b", again=1),  # a redelivered copy's same ticket: no new grant
            claim_ok("a", T0, late=300),
            claim_ok("a", T0, late=300, again=1),  # a re-claim of the same start
            {"op": "claim:WAIT", "now": str(T0), "task": "b", "interval": str(I_US)},
            claim_ok("b", T0 + I_US, late=2_000),  # exactly one interval: no violation
            claim_ok("c", T0 + I_US + 60_000, late=0),  # 60 ms < 100 ms: a violation
            claim_ok("c", T0 + 3 * I_US, late=5_000, readmit=1),  # c's start was missed
        ]
    )
    assert (tally.starts, tally.grants, tally.readmits, tally.violations) == (4, 2, 1, 1)
    assert tally.ops == {"grant:OK": 3, "claim:OK": 5, "claim:WAIT": 1}
    assert tally.last_violation is not None
    assert (tally.last_violation.task, tally.last_violation.prev_task) == ("c", "b")
    assert (tally.last_violation.gap_us, tally.last_violation.interval_us) == (60_000, I_US)
    cumulative, count, total = tally.lateness.snapshot()
    assert count == 4 and total == pytest.approx((300 + 2_000 + 0 + 5_000) / 1e6)
    assert dict(cumulative)[0.0005] == 2 and dict(cumulative)[0.0025] == 3
    assert tally.last_late_us == 5_000 and tally.interval_us == I_US


def test_a_moved_readmit_puts_the_missed_start_at_its_own_time() -> None:
    """A moved readmit replaces its copy's missed start, the bucket's start just before it: no
    violation from it, the next start measured from it; one of another copy replaces nothing."""
    missed = {"holder": "w1/00000000000b"}
    tally = fed(
        [
            claim_ok("a", T0),
            claim_ok("b", T0 + I_US, **missed),
            claim_ok("b", T0 + I_US + 40_000, readmit=1, moved=1, **missed),
            claim_ok("c", T0 + 2 * I_US + 40_000),  # one interval after the moved start
            claim_ok("d", T0 + 3 * I_US + 40_000),
            claim_ok("e", T0 + 3 * I_US + 60_000, readmit=1, moved=1),  # not d's copy
        ]
    )
    assert (tally.starts, tally.readmits, tally.violations) == (6, 2, 1)
    assert tally.last_violation is not None and tally.last_violation.task == "e"
    assert [start for start, _late in tally.window(T0 + 10 * I_US, 20 * I_US)] == [
        T0, T0 + I_US + 40_000, T0 + 2 * I_US + 40_000, T0 + 3 * I_US + 40_000,
        T0 + 3 * I_US + 60_000,
    ]  # fmt: skip


def test_the_interval_of_a_start_without_one_comes_from_the_last_control_entry() -> None:
    control = {"op": "set_interval", "now": str(T0), "changed": "1", "interval": str(2 * I_US)}
    tally = fed(
        [
            claim_ok("a", T0, interval=None),  # no interval known yet: no check
            control,
            claim_ok("b", T0 + I_US + 50_000, interval=None),  # 150 ms < 200 ms
            claim_ok("c", T0 + 2 * I_US + 50_000),  # its own 100 ms: kept
        ]
    )
    assert (tally.starts, tally.violations) == (3, 1)


def test_fed_in_pieces_it_counts_as_fed_at_once() -> None:
    entries = [claim_ok(f"t{i}", T0 + i * 90_000 + (i % 3) * 20_000) for i in range(30)]
    whole = fed(entries)
    pieces = BucketTally()
    for start in range(0, len(entries), 7):
        for fields in entries[start : start + 7]:
            pieces.feed(fields)
    assert whole.violations > 0
    assert (pieces.starts, pieces.violations) == (whole.starts, whole.violations)


def test_the_same_violations_as_the_demo_figures() -> None:
    """Two consumers of ``celery_interval.starts``: the demo's figures and the tally agree."""
    rng = random.Random(7)
    start, entries = T0, []
    for i in range(500):
        start += rng.choice((I_US, I_US, I_US + 1, I_US - 1, I_US // 2, 3 * I_US))
        entries.append(claim_ok(f"t{i}", start, late=rng.randrange(10_000)))
        if rng.random() < 0.2:
            entries.append(claim_ok(f"t{i}", start, again=1))
    tally = fed(entries)
    figures = figures_from(
        [], [(str(n), e) for n, e in enumerate(entries)], tasks=1, interval_s=I_US / 1e6, workers=1
    )
    assert tally.violations == figures.violations > 0
    assert tally.starts == figures.claims == 500


def test_the_window_keeps_the_recent_starts() -> None:
    tally = fed([claim_ok(f"t{i}", T0 + i * I_US, late=i) for i in range(20)])
    recent = tally.window(T0 + 19 * I_US, 5 * I_US)  # (now - 0.5 s, now]
    assert [late for _, late in recent] == [15, 16, 17, 18, 19]


def test_a_histogram_counts_each_value_in_its_bin() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 2.0, 3.0):
        h.observe(v)
    assert h.snapshot() == ([(0.1, 2), (1.0, 3), (float("inf"), 5)], 5, pytest.approx(5.65))
    with pytest.raises(ValueError):
        Histogram((1.0, 0.5))
    assert len(LATENESS_BOUNDS_S) == len(set(LATENESS_BOUNDS_S))


def test_is_start_leaves_out_reclaims_and_other_outcomes() -> None:
    assert is_start({"op": "claim:OK"}) and is_start({"op": "claim:OK", "again": "0"})
    assert not is_start({"op": "claim:OK", "again": "1"})
    assert not is_start({"op": "claim:WAIT"}) and not is_start({"op": "grant:OK"})


# --- the cursor's accounting of trimmed entries (XINFO STREAM as Redis >= 7 gives it) ---


def info(length: int, first: str | None, added: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"length": length, "first-entry": (first, {}) if first else None}
    if added is not None:
        out["entries-added"] = added
    return out


def test_the_cursor_counts_entries_trimmed_before_they_were_read() -> None:
    c = Cursor()
    c.account(3, info(3, "1-0", 10))  # 7 trimmed before the first look: history, not lost
    c.last_id = "3-0"
    assert (c.gaps, c.lost, c.accounted) == (0, 0, 10)
    c.account(2, info(5, "1-0", 12))  # two more, nothing trimmed past the cursor
    c.last_id = "5-0"
    assert (c.gaps, c.lost, c.accounted) == (0, 0, 12)
    c.account(4, info(4, "9-0", 20))  # 8 added, 4 left, all after the cursor: 4 lost
    c.last_id = "12-0"
    assert (c.gaps, c.lost, c.accounted) == (1, 4, 20)
    older = Cursor(last_id="5-0")  # Redis < 7: a trim past the cursor is all it can tell
    older.account(1, info(1, "9-0", None))
    assert (older.gaps, older.lost) == (1, 0)


# --- real streams ---


def test_the_tail_reads_a_hand_written_stream_incrementally(redis_client: redis.Redis[Any]) -> None:
    reader = LedgerReader(redis_client)
    key = reader.ledger_key("api")
    for i, start in enumerate((T0, T0 + I_US, T0 + I_US + 30_000)):
        redis_client.xadd(key, claim_ok(f"t{i}", start))  # type: ignore[arg-type]
    tail = LedgerTail(reader, page=2)  # pages of two: the third entry takes a second page
    tail.follow(reader.buckets())
    assert tail.poll() == 3
    tally = tail.tallies["api"]
    assert (tally.starts, tally.violations) == (3, 1)
    assert tail.poll() == 0
    redis_client.xadd(key, claim_ok("t3", T0 + 2 * I_US + 30_000))  # type: ignore[arg-type]
    redis_client.xadd(key, claim_ok("t3", T0 + 2 * I_US + 30_000, again=1))  # type: ignore[arg-type]
    assert tail.poll() == 2
    assert (tally.starts, tally.violations) == (4, 1)
    assert (tail.cursors["api"].gaps, tail.cursors["api"].lost) == (0, 0)


def _redis7_binary() -> str | None:
    """A redis-server of version 7 or later on this machine (they count entries added)."""
    for path in {
        shutil.which("redis-server"),
        "/usr/bin/redis-server",
        "/usr/local/bin/redis-server",
    }:
        if path and os.access(path, os.X_OK):
            out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
            match = re.search(r"v=(\d+)\.", out)
            if match and int(match.group(1)) >= 7:
                return path
    return None


@pytest.fixture(scope="module")
def redis7() -> Iterator[redis.Redis[Any]]:
    binary = _redis7_binary()
    if binary is None:
        pytest.skip("no redis-server >= 7 on this machine (XINFO STREAM's entries-added)")
    with RedisProc(binary=binary) as server:
        client: redis.Redis[Any] = redis.Redis.from_url(server.url)
        yield client
        client.close()


def trim_past_the_tail(client: Any) -> LedgerTail:
    """A tail that read one entry, then ten more added to a stream capped at 4 (exactly)."""
    client.flushdb()
    reader = LedgerReader(client)
    key = reader.ledger_key("api")
    client.xadd(key, claim_ok("t0", T0))  # type: ignore[arg-type]
    tail = LedgerTail(reader)
    tail.follow(["api"])
    tail.poll()
    for i in range(1, 11):
        entry = claim_ok(f"t{i}", T0 + i * I_US)
        client.xadd(key, entry, maxlen=4, approximate=False)  # type: ignore[arg-type]
    tail.poll()
    return tail


def test_the_tail_counts_what_a_trim_took_before_it_read_it(redis7: redis.Redis[Any]) -> None:
    tail = trim_past_the_tail(redis7)
    cursor, tally = tail.cursors["api"], tail.tallies["api"]
    assert (cursor.gaps, cursor.lost, tally.starts) == (1, 6, 5)
    # the first start after the gap is measured against the last one read (t0): a long gap,
    # never a false violation
    assert tally.violations == 0


def test_before_redis_7_the_tail_notes_the_gap(redis_client: redis.Redis[Any]) -> None:
    """Whatever the session's server is: a gap always; the lost count only from Redis 7."""
    major = int(str(redis_client.info("server")["redis_version"]).split(".")[0])
    tail = trim_past_the_tail(redis_client)
    cursor = tail.cursors["api"]
    assert (cursor.gaps, cursor.lost) == (1, 6 if major >= 7 else 0)


def test_the_ledger_the_scripts_write_counts_each_start_once(
    redis_client: redis.Redis[Any],
) -> None:
    """Grants and claims by the real Lua scripts: re-claims and redelivered copies do not
    count, the spacing holds, and lateness is what the claims recorded."""
    scripts_ledger_counts_each_start_once(redis_client)


def scripts_ledger_counts_each_start_once(client: Any) -> None:
    clock = Clock(T0)
    store = RedisStore(client, now_us=clock)
    copies = [TaskCopy("api", f"t{i}", 0) for i in range(5)]
    grants = [store.grant(c, Pace(I_US)) for c in copies]
    assert store.grant(copies[0], Pace(I_US)).ticket == grants[0].ticket  # a copy: again=1
    terms = ClaimTerms("w1/0123456789ab", 30_000_000)
    for copy, grant in zip(copies, grants):
        clock.now_us = grant.slot_us + 250  # each claim 250 µs after its slot
        assert store.claim(copy, I_US, grant.slot, terms).outcome is Outcome.OK
        assert store.claim(copy, I_US, grant.slot, terms).outcome is Outcome.OK  # again
    tail = LedgerTail(LedgerReader(client))
    tail.follow(["api"])
    tail.poll()
    tally = tail.tallies["api"]
    assert (tally.starts, tally.grants, tally.violations, tally.readmits) == (5, 5, 0, 0)
    _, count, total = tally.lateness.snapshot()
    assert count == 5 and total == pytest.approx(5 * 250 / 1e6)


# --- a Redis Cluster store: every master's ledgers ---


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[RedisProc]]:
    with three_masters() as nodes:
        yield nodes


@pytest.fixture
def cluster_client(cluster: list[RedisProc]) -> Iterator[redis.RedisCluster[Any]]:
    """A RedisCluster client of the 3-master cluster, every node flushed first."""
    flush(cluster)
    client = cluster_client_of(cluster)
    yield client
    client.close()


def test_the_tail_follows_the_ledgers_of_every_master_in_few_round_trips(
    cluster: list[RedisProc], cluster_client: redis.RedisCluster[Any], monkeypatch: Any
) -> None:
    """300 buckets over three masters: each bucket's starts and violations, read in one round
    trip per node and ``BATCH_BUCKETS`` buckets (at most 6 here), not one per bucket."""
    reader = LedgerReader(cluster_client)
    buckets = [f"b{i}" for i in range(300)]
    for i, bucket in enumerate(buckets):
        gaps = [I_US] * (i % 3) + ([30_000] if i % 50 == 0 else [])  # 30 ms: a violation
        start = T0
        for k, gap in enumerate([0, *gaps]):
            start += gap
            cluster_client.xadd(reader.ledger_key(bucket), claim_ok(f"t{k}", start))  # type: ignore[arg-type]
    per_master = ledger_buckets_per_master(cluster)
    assert [len(found) > 50 for found in per_master] == [True] * 3
    assert set().union(*per_master) == set(buckets) == set(reader.buckets())
    round_trips: list[int] = []

    def counted(node: Any, asks: Any) -> Any:
        round_trips.append(len(asks))
        return read_pages(node, asks)

    monkeypatch.setattr(tail_module, "read_pages", counted)
    tail = LedgerTail(reader)
    tail.follow(buckets)
    expected_starts = {b: 1 + i % 3 + (i % 50 == 0) for i, b in enumerate(buckets)}
    assert tail.poll() == sum(expected_starts.values())
    assert {b: t.starts for b, t in tail.tallies.items()} == expected_starts
    assert {b for b, t in tail.tallies.items() if t.violations} == set(buckets[::50])
    per_node = sorted(len(found) for found in per_master)
    batches = sorted(
        size
        for n in per_node
        for size in [BATCH_BUCKETS] * (n // BATCH_BUCKETS) + [n % BATCH_BUCKETS]
        if size
    )
    assert sorted(round_trips) == batches and len(batches) <= 6
    round_trips.clear()
    cluster_client.xadd(reader.ledger_key("b7"), claim_ok("late", T0 + 10 * I_US))  # type: ignore[arg-type]
    assert tail.poll() == 1 and tail.tallies["b7"].starts == expected_starts["b7"] + 1
    assert sorted(round_trips) == batches
    assert all(c.gaps == 0 and c.lost == 0 for c in tail.cursors.values())
    tail.follow(["no-ledger"])  # a bucket with state but no ledger yet: XINFO fails, no harm
    assert tail.poll() == 0 and tail.tallies["no-ledger"].starts == 0


def test_the_tail_counts_what_a_trim_took_on_a_cluster() -> None:
    """On a cluster of Redis >= 7 masters the tail counts exactly what a trim took, as on one
    server (each bucket's page and stream info still come from one MULTI)."""
    binary = _redis7_binary()
    if binary is None:
        skip_or_fail("no redis-server >= 7 on this machine (XINFO STREAM's entries-added)")
    with three_masters(binary) as nodes:
        client = cluster_client_of(nodes)
        tail = trim_past_the_tail(client)
        client.close()
    cursor, tally = tail.cursors["api"], tail.tallies["api"]
    assert (cursor.gaps, cursor.lost, tally.starts, tally.violations) == (1, 6, 5, 0)


def test_the_ledger_the_scripts_write_on_a_cluster_counts_each_start_once(
    cluster_client: redis.RedisCluster[Any],
) -> None:
    scripts_ledger_counts_each_start_once(cluster_client)


def test_a_master_that_stops_answering_makes_the_tail_unavailable_then_it_catches_up() -> None:
    """A master stopped (SIGSTOP): the poll raises StoreUnavailable (the exporter serves
    ``up 0``); once it answers again (SIGCONT) every entry is read, none twice."""
    with three_masters() as nodes:
        client = redis.RedisCluster(host="127.0.0.1", port=nodes[0].port, socket_timeout=1.0)
        reader = LedgerReader(client)
        buckets = [f"b{i}" for i in range(30)]
        for bucket in buckets:
            client.xadd(reader.ledger_key(bucket), claim_ok("t0", T0))  # type: ignore[arg-type]
        tail = LedgerTail(reader)
        tail.follow(buckets)
        assert tail.poll() == 30
        for bucket in buckets:
            client.xadd(reader.ledger_key(bucket), claim_ok("t1", T0 + I_US))  # type: ignore[arg-type]
        assert nodes[1].proc is not None
        os.kill(nodes[1].proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable):
                tail.poll()
        finally:
            os.kill(nodes[1].proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while True:  # the other masters may have marked it failing: wait for them to see it
            try:
                tail.poll()
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline, "the cluster did not come back"
                time.sleep(0.2)
        assert {b: t.starts for b, t in tail.tallies.items()} == dict.fromkeys(buckets, 2)
        assert all(c.gaps == 0 and c.lost == 0 for c in tail.cursors.values())
        client.close()
