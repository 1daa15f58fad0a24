"""Thousands of tenant buckets: store listing, `interval status` options, capped interval_stats."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from celery_interval.schedule import Limit, Pace
from celery_interval.stores import store_from_url
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.memory import MemoryStore
from celery_interval.stores.redis import RedisStore
from celery_interval.stores.scan import read_statuses, store_buckets
from celery_interval.worker.control import interval_stats
from celery_interval.worker.held import Held
from tests.helpers.cli import run  # noqa: F401  (the fixture)
from tests.helpers.clusters import (
    buckets_on,
    cluster,  # noqa: F401  (the fixture)
)
from tests.helpers.failover import cluster_url
from tests.helpers.fakes import INTERVAL_US, Request, make_service

API_INTERVAL_US = 1_000_000  # cliapp's "api": 1.0


def grant_each(store: RedisStore, buckets: list[str], grants: int = 1) -> None:
    for bucket in buckets:
        for n in range(grants):
            store.grant(TaskCopy(bucket, f"{bucket}-{n}", 0), Pace(API_INTERVAL_US))


def test_store_listing_escapes_the_prefix_and_reads_statuses_in_batches(
    redis_client: Any,
) -> None:
    """Only this prefix's state hashes are listed (glob characters of the prefix are literal),
    and the pipelined statuses equal one `status` call per bucket."""
    store = RedisStore(redis_client, key_prefix="t*[1]:")
    neighbour = RedisStore(redis_client, key_prefix="t1:")  # matched if the prefix were a glob
    try:
        buckets = [f"api:k{i}" for i in range(300)]
        grant_each(store, buckets[:250])
        store.pause(buckets[250], API_INTERVAL_US)
        store.set_interval(buckets[251], API_INTERVAL_US, 50_000)
        grant_each(neighbour, ["api:other"])
        listed = store_buckets(store)
        assert listed == sorted(buckets[:252])
        assert store_buckets(store, "api:k1?") == [f"api:k{i}" for i in range(10, 20)]
        pace = Pace(API_INTERVAL_US, burst=2, limits=(Limit(10 * API_INTERVAL_US),))
        wanted = [(b, pace) for b in buckets]
        batched = read_statuses(store, wanted, batch=64)
        one_by_one = [store.status(b, API_INTERVAL_US, pace) for b in buckets]
        assert {len(s.units_left) for s in batched} == {2}, "read with the burst and the limit"
        fields = ("exists", "interval_us", "overridden", "paused", "ticket")
        assert [[getattr(s, f) for f in fields] for s in batched] == [
            [getattr(s, f) for f in fields] for s in one_by_one
        ]
        stored = ("epoch", "last_start_us", "current_slot_us")  # a new bucket's are from now
        assert [[getattr(s, f) for f in stored] for s in batched[:252]] == [
            [getattr(s, f) for f in stored] for s in one_by_one[:252]
        ]
        assert [s.exists for s in batched] == [True] * 252 + [False] * 48
        assert batched[250].paused and batched[251].interval_us == 50_000
    finally:
        store.close()
        neighbour.close()


def test_a_memory_store_lists_what_it_holds() -> None:
    store = MemoryStore()
    for bucket in ("api:a", "api:b", "mail:c"):
        store.pause(bucket, API_INTERVAL_US)
    assert store_buckets(store, "api:*") == ["api:a", "api:b"]


def status_json(run: Any, *args: str) -> dict[str, Any]:  # noqa: F811
    result = run("status", "--json", "--timeout", "0.1", *args)
    assert result.exit_code == 0, result.output
    found: dict[str, Any] = json.loads(result.output)
    return found


def test_status_over_thousands_of_stored_tenant_buckets(run: Any, redis_server: Any) -> None:  # noqa: F811
    """Tenant buckets exist only in the store: status finds them, filters by --match, shows
    --top of them in --sort order and says how many matched."""
    store = RedisStore.from_url(redis_server.url_for(0))
    try:
        shops = [f"api:shop-{i:04d}" for i in range(3000)]
        grant_each(store, shops)
        grant_each(store, [f"mail:t{i}" for i in range(500)])
        busy = {"api:shop-0007": 9, "api:shop-2500": 7, "api:shop-1234": 5}
        for bucket, grants in busy.items():
            # a second ticket, then more
            store.grant(TaskCopy(bucket, "x", 0), Pace(API_INTERVAL_US))
            for n in range(grants - 2):
                store.grant(TaskCopy(bucket, f"y{n}", 0), Pace(API_INTERVAL_US))
            # Paused, a bucket's virtual time stands still: its backlog stays 4-8 s ahead
            # however long this test takes on a slow host.
            store.pause(bucket, API_INTERVAL_US)
        store.pause("gone:x", API_INTERVAL_US)  # a bucket of a queue no longer configured
    finally:
        store.close()

    default = status_json(run)
    assert (default["total"], default["shown"], default["unconfigured"]) == (3502, 20, 1)
    assert len(default["queues"]) == 20
    assert [r["queue"] for r in default["queues"][:3]] == list(busy), "most backed up first"
    assert default["queues"][0]["tickets"] == 9
    nexts = [r["next_slot_in_s"] for r in default["queues"]]
    assert nexts == sorted(nexts, reverse=True)

    matched = status_json(run, "--match", "api:shop-1*", "--top", "0", "--sort", "name")
    assert (matched["total"], matched["shown"]) == (1000, 1000)
    assert [r["queue"] for r in matched["queues"]] == shops[1000:2000]
    assert all(r["exists"] and r["interval_s"] == 1.0 for r in matched["queues"])

    by_ticket = status_json(run, "--sort", "ticket", "--top", "3")
    assert [(r["queue"], r["tickets"]) for r in by_ticket["queues"]] == list(busy.items())
    assert (by_ticket["total"], by_ticket["shown"]) == (3502, 3)

    configured = status_json(run, "--match", "mail", "--top", "0")
    assert [(r["queue"], r["exists"]) for r in configured["queues"]] == [("mail", False)]
    assert status_json(run, "--match", "nothing-*")["total"] == 0

    table = run("status", "--timeout", "0.1", "--match", "api:*", "--top", "5", "--sort", "name")
    assert table.exit_code == 0, table.output
    footer = table.output.strip().splitlines()[-2:]
    assert footer == [
        "showing 5 of 3000 buckets (use --top/--match)",
        "held: no worker answered within 0.1s",  # none runs: held is unknown, not 0
    ], table.output
    assert "api:shop-0004" in table.output and "api:shop-0005" not in table.output


def receive_many(
    service: Any, held_per_bucket: dict[str, int], costs: dict[str, int] | None = None
) -> None:
    """``count`` held tasks of each bucket, of cost ``costs[bucket]`` (else 1), burst 3."""
    for bucket, count in held_per_bucket.items():
        for n in range(count):
            service.receive(
                Held(
                    request=Request(f"{bucket}/{n}"),
                    bucket=bucket,
                    task_id=f"{bucket}/{n}",
                    retries=0,
                    queue="api",
                    interval_us=INTERVAL_US,
                    not_before_in_us=0,
                    holder=service.new_holder(),
                    acks_late=False,
                    release=lambda req: None,
                    burst=3,
                    cost=(costs or {}).get(bucket, 1),
                )
            )


def test_interval_stats_of_thousands_of_buckets_is_capped() -> None:
    """The top buckets by held tasks, each listing its first tasks by ticket; the total counts
    every bucket that matched; a bad argument is an error reply."""
    store = MemoryStore(lambda: 1_000_000_000)  # a stopped clock: no slot comes while it runs
    service = make_service(store, [])
    service.slots.pool.free = lambda: 1_000  # every held task takes a ticket
    store.pause("api", INTERVAL_US)
    held = {f"api:t{i:04d}": 1 + i % 3 for i in range(3000)}
    held["api:t0042"] = 25
    held["api:t2999"] = 12
    receive_many(service, held, costs={"api:t0042": 2})
    state = SimpleNamespace(consumer=SimpleNamespace(interval_service=service))

    stats = interval_stats(state)
    buckets = [k for k in stats if not k.startswith("_")]
    assert len(buckets) == 20 and stats["_buckets_total"] == 3000
    assert buckets[:2] == ["api:t0042", "api:t2999"], "most held first"
    assert all(stats[b]["held"] == 3 for b in buckets[2:])
    top = stats["api:t0042"]
    assert top["held"] == 25 and len(top["held_tasks"]) == 10
    tickets = sorted(h.ticket for h in service.holding.held["api:t0042"])
    assert [h["ticket"] for h in top["held_tasks"]] == tickets[:10]
    assert {h["cost"] for h in top["held_tasks"]} == {2}, "each held task's cost"
    assert {h["cost"] for h in stats["api:t2999"]["held_tasks"]} == {1}
    assert (top["burst"], top["limits"]) == (3, [])
    assert stats["_queues_stopped"] == []
    assert len(json.dumps(stats)) < 20_000

    matched = interval_stats(state, top=0, match="api:t1*")
    assert matched["_buckets_total"] == 1000
    assert len([k for k in matched if not k.startswith("_")]) == 1000
    chosen = interval_stats(state, top=0, tasks=0, buckets=["api:t0042", "api:nope"])
    assert list(chosen) == ["api:t0042", "_buckets_total", "_queues_stopped"]
    assert chosen["api:t0042"]["held_tasks"] == [] and chosen["api:t0042"]["held"] == 25

    every = service.snapshot(top=0, tasks=1_000)
    assert len(every["api:t0042"]["held_tasks"]) == 25

    for bad in ({"top": -1}, {"top": "x"}, {"match": 3}, {"buckets": "api"}):
        assert "error" in interval_stats(state, **bad), bad


@pytest.mark.parametrize("argv", [("5", "api:t1*")])
def test_interval_stats_arguments_are_typed_for_the_command_line(argv: tuple[str, ...]) -> None:
    """`celery inspect interval_stats 5 'api:t1*'` passes top as an int and match as a str."""
    from celery.worker.control import Panel

    meta = Panel.meta["interval_stats"]
    assert [(name, kind(value)) for (name, kind), value in zip(meta.args, argv)] == [
        ("top", 5),
        ("match", "api:t1*"),
    ]


def test_a_cluster_store_is_listed_on_every_primary(cluster: Any) -> None:  # noqa: F811
    """Buckets spread over three masters are all listed, and their statuses read per node."""
    store = store_from_url(cluster_url(cluster))
    assert isinstance(store, RedisStore)
    try:
        buckets = [f"api:c{i}" for i in range(600)]
        grant_each(store, buckets[:500])
        on_nodes = [len(buckets_on(redis.Redis(port=n.port, decode_responses=True), "s"))
                    for n in cluster]  # fmt: skip
        assert all(on_nodes) and sum(on_nodes) >= 500
        assert store_buckets(store, "api:c*") == sorted(buckets[:500])
        found = read_statuses(store, [(b, Pace(API_INTERVAL_US)) for b in buckets], batch=50)
        assert [s.exists for s in found] == [True] * 500 + [False] * 100
        assert [s.ticket for s in found[:500]] == [
            store.status(b, API_INTERVAL_US).ticket for b in buckets[:500]
        ]
    finally:
        store.close()
