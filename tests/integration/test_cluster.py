"""Redis Cluster as the store: a real local 3-master cluster named by a redis+cluster:// URL."""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_interval.demo.embedded import RedisProc
from celery_interval.errors import ConfigurationError, StoreUnavailable
from celery_interval.schedule import ClaimTerms, Outcome, Pace
from celery_interval.schedule.outer import Outer
from celery_interval.starts import happened
from celery_interval.stores import mask_url, store_from_url
from celery_interval.stores.base import DoneBatch, TaskCopy
from celery_interval.stores.redis import RedisStore
from celery_interval.stores.scripts import script_source
from tests.helpers.assertions import assert_exactly_once, assert_ticket_order
from tests.helpers.clusters import (
    buckets_on,
    cluster,  # noqa: F401  (the fixture)
)
from tests.helpers.failover import cluster_url
from tests.helpers.ledgers import one_per_run
from tests.helpers.pool import Pool, run_once
from tests.helpers.store_exercise import exercise

BUCKETS = 1000
INTERVAL_US = 200_000
LEASE_US = 30_000_000
DEDUPE_US = 3_600_000_000


@pytest.fixture
def node_clients(cluster: list[RedisProc]) -> Iterator[list[redis.Redis[str]]]:  # noqa: F811
    """A plain client of each node (sees only that node's keys); every node flushed first."""
    clients = [redis.Redis(port=n.port, decode_responses=True) for n in cluster]
    for client in clients:
        client.flushall()
    yield clients
    for client in clients:
        client.close()


def test_a_thousand_buckets_spread_over_three_masters(
    cluster: list[RedisProc],  # noqa: F811
    node_clients: list[redis.Redis[str]],
) -> None:
    store = store_from_url(cluster_url(cluster))
    assert isinstance(store, RedisStore)
    buckets = [f"tenant-{i}" for i in range(BUCKETS)]
    grants = {
        b: [store.grant(TaskCopy(b, f"{b}/t{k}", 0), Pace(INTERVAL_US)) for k in (1, 2, 3)]
        for b in buckets
    }
    for bucket, granted in grants.items():
        assert [g.outcome for g in granted] == [Outcome.OK] * 3, bucket
        assert [g.ticket for g in granted] == [1, 2, 3], bucket
        slots = [g.slot_us for g in granted]
        assert [b - a for a, b in itertools.pairwise(slots)] == [INTERVAL_US] * 2, bucket
    # every first slot is at most one interval (plus the new epoch's lead) after its grant
    time.sleep(max(g[0].delay_us for g in grants.values()) / 1e6 + 0.005)

    for bucket, (first, second, _) in grants.items():
        ok = store.claim(
            TaskCopy(bucket, f"{bucket}/t1", 0), INTERVAL_US, first.slot, ClaimTerms("h", LEASE_US)
        )
        assert ok.outcome is Outcome.OK, (bucket, ok)
        early = store.claim(
            TaskCopy(bucket, f"{bucket}/t2", 0), INTERVAL_US, second.slot, ClaimTerms("h", LEASE_US)
        )
        assert early.outcome is Outcome.WAIT and early.delay_us > 0, (bucket, early)
    store.done([TaskCopy(b, f"{b}/t1", 0) for b in buckets], DEDUPE_US)
    again = {b: store.grant(TaskCopy(b, f"{b}/t1", 0), Pace(INTERVAL_US)).outcome for b in buckets}
    assert set(again.values()) == {Outcome.DUPLICATE}

    states = [buckets_on(c, "s") for c in node_clients]
    per_node = [len(s) for s in states]
    print(f"buckets per master: {per_node}")
    assert sum(per_node) == BUCKETS and set().union(*states) == set(buckets)
    assert min(per_node) > 0, f"a master owns no bucket: {per_node}"
    for client, own in zip(node_clients, states, strict=True):
        # the ledger and the marks of a bucket live on the master that holds its state
        assert buckets_on(client, "l") == own
        assert buckets_on(client, "m") == own
        for bucket in list(own)[:5]:
            ops = [f["op"] for _, f in client.xrange(f"ci:{{{bucket}}}:l")]
            assert ops.count("grant:OK") == 3 and "claim:OK" in ops and "claim:WAIT" in ops


def test_scripts_reload_on_every_master_from_one_seed(
    cluster: list[RedisProc],  # noqa: F811
    node_clients: list[redis.Redis[str]],
) -> None:
    store = store_from_url(f"redis+cluster://127.0.0.1:{cluster[1].port}")  # discovers the rest
    assert isinstance(store, RedisStore)
    buckets = [f"b{i}" for i in range(30)]
    for bucket in buckets:
        store.status(bucket, INTERVAL_US)  # loads the status script where it runs
    for client in node_clients:
        client.script_flush()
    marks = []
    for bucket in buckets:
        assert store.grant(TaskCopy(bucket, "t", 0), Pace(INTERVAL_US)).ticket == 1
        marks.append(TaskCopy(bucket, "t", 0))
    store.done(marks, DEDUPE_US)  # one script call per bucket: EVALSHA cannot be cluster-pipelined
    assert {store.grant(TaskCopy(b, "t", 0), Pace(INTERVAL_US)).outcome for b in buckets} == {
        Outcome.DUPLICATE
    }
    sha = hashlib.sha1(script_source("grant", fenced=True).encode()).hexdigest()  # Script.sha
    assert [c.script_exists(sha) for c in node_clients] == [[True]] * 3
    assert all(buckets_on(c, "s") for c in node_clients), "every master served some bucket"


def test_every_operation_on_every_master(
    cluster: list[RedisProc],  # noqa: F811
    node_clients: list[redis.Redis[str]],
) -> None:
    store = store_from_url(cluster_url(cluster))
    for i in range(12):
        exercise(store, f"ops-{i}")  # grant … reset: the ledger stays behind on its master
    store.close()
    assert all(buckets_on(c, "l") for c in node_clients), "a master ran no operation"


def test_a_cluster_unreachable_at_start_is_unavailable_not_fatal() -> None:
    with RedisProc(cluster=True) as node:
        node.kill()
        url = f"redis+cluster://:cluster-pw@127.0.0.1:{node.port}"
        store = store_from_url(url)  # no connection yet: a worker starting now must not crash
        with pytest.raises(StoreUnavailable) as excinfo:
            store.status("api", INTERVAL_US)
        message = str(excinfo.value)
        assert mask_url(url) in message and "cluster-pw" not in message
        node.restart()  # a one-node cluster on the same port
        redis.Redis(port=node.port).config_set("requirepass", "cluster-pw")
        # the same store connects now
        assert store.grant(TaskCopy("api", "t", 0), Pace(INTERVAL_US)).ticket == 1
        store.close()


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("redis+cluster://127.0.0.1:notaport", "'127.0.0.1:notaport'"),
        ("redis+cluster://127.0.0.1:7000,:7001", "':7001'"),
        ("redis+cluster://", "''"),
        ("redis+cluster://127.0.0.1:7000/3", "only database 0"),
        ("redis+cluster://:s3cret@127.0.0.1:7000?db=2", "only database 0"),
        ("rediss+cluster://127.0.0.1:7000?ssl_ca_cert=/ca.pem", "ssl_ca_cert"),
    ],
)
def test_malformed_cluster_urls_are_named(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        store_from_url(url)
    message = str(excinfo.value)
    assert named in message and mask_url(url) in message and "s3cret" not in message


@pytest.mark.slow
def test_a_worker_on_the_cluster_store(
    cluster: list[RedisProc],  # noqa: F811
    node_clients: list[redis.Redis[str]],
    redis_server: Any,
    tmp_path: Path,
) -> None:
    interval_s = 0.05
    pool = Pool(
        broker=redis_server.broker_url_for(7),
        store=cluster_url(cluster),
        interval_s=interval_s,
        tmp=tmp_path,
        record_url=redis_server.url_for(8),
    )
    ids, records = run_once(pool, 12)
    assert_exactly_once(records, ids)
    assert_ticket_order(pool, records, interval_s)
    store = store_from_url(cluster_url(cluster))
    assert isinstance(store, RedisStore)
    entries = [f for _, f in store.ledger(pool.queue)]
    assert len(one_per_run(entries)) == 12
    starts = sorted(int(f["start"]) for f in happened(entries))
    assert min(b - a for a, b in itertools.pairwise(starts)) >= round(interval_s * 1e6)


def test_a_take_carries_done_marks_of_other_buckets_on_a_cluster(cluster: list[RedisProc]) -> None:  # noqa: F811
    """On a Cluster the marks go one call per bucket (each to its own master), still ahead of
    the take: a copy whose mark rides with it is a duplicate, and every mark lands."""
    store = store_from_url(cluster_url(cluster))
    assert isinstance(store, RedisStore)
    marks = [TaskCopy(f"carry-{i}", f"t{i}", 0) for i in range(8)]
    copy = marks[3]
    grant, claim = store.take(
        TaskCopy(copy.bucket, copy.task_id, 0),
        Pace(INTERVAL_US),
        ClaimTerms("h", LEASE_US),
        done_first=DoneBatch(marks, 10**6),
    )
    assert grant.outcome is Outcome.DUPLICATE and claim is None
    assert all(
        store.take(TaskCopy(m.bucket, m.task_id, 0), Pace(INTERVAL_US), ClaimTerms("h", LEASE_US))[
            0
        ].outcome
        is Outcome.DUPLICATE
        for m in marks
    )


def test_nested_buckets_on_three_masters(
    cluster: list[RedisProc],  # noqa: F811
    node_clients: list[redis.Redis[str]],
) -> None:
    """Ten accounts, each with three tenants nested in it, over three masters: every tenant's
    keys sit on its account's master (the account's tag first), and in each account the three
    tenants' first slots (their own interval is half the account's) come one account
    interval apart, after the account's own task."""
    accounts = [f"acct{i}" for i in range(10)]
    tenants = ["a", "b", "c"]

    def nesting(bucket: str) -> Outer | None:
        account, _, tenant = bucket.partition(":")
        return Outer(account, INTERVAL_US) if tenant else None

    store = store_from_url(cluster_url(cluster), nesting=nesting)
    for account in accounts:
        store.grant(TaskCopy(account, "own", 0), Pace(INTERVAL_US))  # the account's own task
        granted = [
            store.grant(TaskCopy(f"{account}:{t}", "t1", 0), Pace(INTERVAL_US // 2))
            for t in tenants
        ]
        gaps = [b.slot_us - a.slot_us for a, b in itertools.pairwise(granted)]
        assert gaps == [INTERVAL_US, INTERVAL_US], (account, gaps)
    masters = []
    for client in node_clients:
        own = set(client.scan_iter(match="ci:{acct*", count=1000))
        mine = {key[4 : key.index("}")] for key in own}
        masters.append(mine)
        nested = [key for key in own if "}{" in key]
        assert len(nested) == len(mine) * len(tenants) * 3  # a state, a mark, a ledger each
        for key in nested:  # beside its account's state, on this master
            assert f"ci:{{{key[4 : key.index('}')]}}}:s" in own, key
    assert set().union(*masters) == set(accounts) and all(masters), masters
