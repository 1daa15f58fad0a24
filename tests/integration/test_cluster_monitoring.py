"""The exporter, ``interval top`` and ``interval ledger export`` on a 3-master Redis Cluster
store: a hand-written ledger, and real workers whose buckets sit on every master."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from celery_interval.config.table import KEY_PREFIX
from celery_interval.demo.embedded import RedisProc
from celery_interval.starts import is_readmit, is_start
from celery_interval.stores import keys
from tests.helpers.clusters import (
    cluster,  # noqa: F401  (the fixture)
    cluster_client_of,
    flush,
    ledger_buckets_per_master,
)
from tests.helpers.exporter import (
    serving_exporter,
    top_shows_the_ledger_and_the_store,
    values,
    wait_for,
)
from tests.helpers.failover import cluster_url, slot_owner
from tests.helpers.pool import celery_cli


@pytest.fixture
def cluster_run(
    monkeypatch: pytest.MonkeyPatch,
    redis_server: Any,
    cluster: list[RedisProc],  # noqa: F811
) -> Any:
    """``celery -A tests.helpers.cliapp:app interval …`` (queues api 1 s, mail 2 s) with the
    emptied cluster as its store."""
    flush(cluster)
    monkeypatch.setenv("CLI_TEST_BROKER", redis_server.broker_url_for(4))
    monkeypatch.setenv("CLI_TEST_STORE", cluster_url(cluster))
    from celery.bin.celery import celery

    def invoke(*args: str) -> Any:
        sys.modules.pop("tests.helpers.cliapp", None)
        return CliRunner().invoke(celery, ["-A", "tests.helpers.cliapp:app", "interval", *args])

    return invoke


def ledger_master(nodes: list[RedisProc], bucket: str) -> int:
    """The index of the master holding ``bucket``'s ledger."""
    return slot_owner(nodes, keys.ledger_key(KEY_PREFIX, bucket))


def test_top_once_and_json_on_a_cluster_store(
    cluster_run: Any,
    cluster: list[RedisProc],  # noqa: F811
) -> None:
    assert ledger_master(cluster, "api") != ledger_master(cluster, "mail")
    client = cluster_client_of(cluster)
    try:
        top_shows_the_ledger_and_the_store(cluster_run, client)
    finally:
        client.close()


def tenants_on_the_other_masters(nodes: list[RedisProc], queue: str) -> list[str]:
    """Two tenant keys whose buckets' ledgers sit on the two masters the queue's does not."""
    wanted = {0, 1, 2} - {ledger_master(nodes, queue)}
    picked: list[str] = []
    for i in range(1000):
        master = ledger_master(nodes, f"{queue}:k{i}")
        if master in wanted:
            wanted.discard(master)
            picked.append(f"k{i}")
            if not wanted:
                return picked
    raise AssertionError(f"no tenant keys of {queue!r} on masters {wanted}")


@pytest.mark.slow
def test_exporter_top_and_export_count_what_real_workers_ran_on_a_cluster(
    make_pool: Any,
    redis_server: Any,
    cluster: list[RedisProc],  # noqa: F811
    tmp_path: Path,
) -> None:
    flush(cluster)
    pool = make_pool(
        0.05,
        broker="redis",
        store=cluster_url(cluster),
        record_url=redis_server.url_for(8),
        env_extra={"CI_TEST_TENANT_INTERVAL": "0.1"},
    )
    q = pool.queue
    tenants = tenants_on_the_other_masters(cluster, q)
    n_queue, per_key = 20, 10
    with serving_exporter(pool, tmp_path) as scrape:
        pool.start(2, concurrency=2)
        pool.send(n_queue)
        with pool.app.producer_or_acquire() as producer:
            for key in tenants:
                for i in range(per_key):
                    pool.app.send_task("workerapp.tenant", args=(key, i), queue=q,
                                       producer=producer)  # fmt: skip
        records = pool.wait_records(n_queue)
        tenant_records = pool.wait_records(len(tenants) * per_key, kind="tenant")
        bodies = {q: len(records)}
        for key in tenants:
            bodies[f"{q}:{key}"] = sum(1 for r in tenant_records if r["args"][0] == key)

        def caught_up(m: dict[Any, float]) -> bool:
            starts = values(m, "celery_interval_starts_total")
            readmits = values(m, "celery_interval_readmits_total")
            return all(starts.get(b, 0) - readmits.get(b, 0) >= n for b, n in bodies.items())

        metrics = wait_for(scrape, caught_up, "the starts")
    masters = {b: ledger_master(cluster, b) for b in bodies}
    assert sorted(masters.values()) == [0, 1, 2]  # one bucket on each master
    per_master = ledger_buckets_per_master(cluster)
    assert all(b in per_master[m] for b, m in masters.items())
    starts = values(metrics, "celery_interval_starts_total")
    readmits = values(metrics, "celery_interval_readmits_total")
    assert {b: starts[b] - readmits[b] for b in bodies} == bodies
    assert sum(bodies.values()) == n_queue + len(tenants) * per_key
    violations = values(metrics, "celery_interval_claim_violations_total")
    assert {b: violations[b] for b in bodies} == dict.fromkeys(bodies, 0)
    gaps = values(metrics, "celery_interval_ledger_gaps_total")
    assert {b: gaps[b] for b in bodies} == dict.fromkeys(bodies, 0)
    intervals = values(metrics, "celery_interval_interval_seconds")
    tenant_intervals = {f"{q}:{key}": 0.1 for key in tenants}
    assert {b: intervals[b] for b in bodies} == pytest.approx({q: 0.05, **tenant_intervals})
    fleet = {name: v for (name, labels), v in metrics.items() if not labels}
    assert fleet["celery_interval_up"] == 1 and fleet["celery_interval_workers"] == 2

    top = celery_cli(pool, "interval", "top", "--json", "--top", "0", "--timeout", "1")
    assert top.returncode == 0, top.stderr
    rows = {row["bucket"]: row for row in json.loads(top.stdout)["buckets"]}
    assert {b: rows[b]["starts"] - rows[b]["readmits"] for b in bodies} == bodies
    assert {b: rows[b]["violations"] for b in bodies} == dict.fromkeys(bodies, 0)

    out = tmp_path / "ledger.jsonl"
    export = celery_cli(pool, "interval", "ledger", "export", "--out", str(out))
    assert export.returncode == 0, export.stderr
    entries = [json.loads(line) for line in out.read_text().splitlines()]
    exported = {
        b: sum(is_start(e) and not is_readmit(e) for e in entries if e["bucket"] == b)
        for b in bodies
    }
    assert exported == bodies
