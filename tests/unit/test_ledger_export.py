"""`interval ledger export`: bounded XRANGE pages, bucket discovery by SCAN, file/part output,
on one Redis server and on a 3-master Redis Cluster."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from celery_interval.config.table import KEY_PREFIX
from celery_interval.demo.embedded import RedisProc
from celery_interval.errors import ConfigurationError
from celery_interval.ledger import LedgerReader, entry_record, export, parse_since_us
from celery_interval.schedule import ClaimTerms, Pace
from celery_interval.stores import keys, store_from_url
from celery_interval.stores.base import TaskCopy
from celery_interval.stores.redis import RedisStore
from tests.helpers.clusters import (
    cluster_client_of,
    flush,
    ledger_buckets_per_master,
    three_masters,
)
from tests.helpers.failover import cluster_url
from tests.helpers.fakeclock import Clock

I_US = 1_000_000
T_US = 1_800_000_000_000_123


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_ops(store: RedisStore, bucket: str, grants: int) -> None:
    for i in range(grants):
        g = store.grant(TaskCopy(bucket, f"t{i}", 0), Pace(I_US))
        store.claim(
            TaskCopy(bucket, f"t{i}", 0), I_US, g.slot, ClaimTerms("w1@h/0123456789ab", 10**9)
        )
    store.done([TaskCopy(bucket, "t0", 0)], 10**9)  # done writes no entry
    store.pause(bucket, I_US)
    store.unpause(bucket, I_US)


def test_entries_round_trip_typed(redis_client: redis.Redis[Any], tmp_path: Path) -> None:
    store = RedisStore(redis_client, now_us=Clock(T_US))
    run_ops(store, "api", 3)
    out = tmp_path / "sub" / "ledger.jsonl"
    result = export(LedgerReader(redis_client), str(out), buckets=["api"], chunk=2)
    expected = [entry_record("api", i, f) for i, f in store.ledger("api")]
    assert lines(out) == expected and result.entries == len(expected) == 8
    assert result.files == [out] and not list(out.parent.glob(".*"))  # no temp file left
    first = expected[0]
    assert first["op"] == "grant:OK" and first["now"] == T_US and first["slot"] > T_US
    assert first["interval"] == I_US and first["task"] == "t0"
    assert expected[1]["holder"] == "w1@h/0123456789ab"
    assert entry_record("b", "1-0", {"task": "42", "now": "7", "x": "y"}) == {
        "bucket": "b", "id": "1-0", "task": "42", "now": 7, "x": "y",
    }, "task ids stay text even when numeric; unknown text fields stay text"  # fmt: skip


def test_buckets_found_by_scan_under_the_prefix(
    redis_client: redis.Redis[Any], tmp_path: Path
) -> None:
    prefix = "a*[b]?:"  # glob characters must match literally
    mine = RedisStore(redis_client, key_prefix=prefix, now_us=Clock(T_US))
    other = RedisStore(redis_client, key_prefix=KEY_PREFIX, now_us=Clock(T_US))
    for bucket in ("api", "tenant:42", "x}y"):
        run_ops(mine, bucket, 1)
    run_ops(other, "api", 2)
    redis_client.set(f"{prefix}{{fake}}:l", "a string, not a stream")
    redis_client.set("aXbY:{api}:l", "would match an unescaped pattern")
    reader = LedgerReader(redis_client, prefix)
    assert reader.buckets() == ["api", "tenant:42", "x}y"]
    result = export(reader, str(tmp_path / "all.jsonl"))
    assert result.per_bucket == {"api": 4, "tenant:42": 4, "x}y": 4}
    assert [r["bucket"] for r in lines(tmp_path / "all.jsonl")] == [
        *["api"] * 4, *["tenant:42"] * 4, *["x}y"] * 4,
    ]  # fmt: skip
    assert LedgerReader(redis_client).buckets() == ["api"]
    assert keys.bucket_of_ledger_key("ci:", "ci:{api}:s") is None


def test_directory_of_part_files(redis_client: redis.Redis[Any], tmp_path: Path) -> None:
    store = RedisStore(redis_client, now_us=Clock(T_US))
    run_ops(store, "api", 4)  # 10 entries
    run_ops(store, "mail", 1)  # 4 entries
    out = tmp_path / "parts"
    result = export(LedgerReader(redis_client), str(out) + "/", part_entries=4, chunk=3)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["_SUCCESS", *[f"part-{n:05d}.jsonl" for n in range(4)]]
    sizes = [len(lines(out / f"part-{n:05d}.jsonl")) for n in range(4)]
    assert sizes == [4, 4, 4, 2] and result.entries == 14
    every = [e for n in range(4) for e in lines(out / f"part-{n:05d}.jsonl")]
    assert [(e["bucket"], e["id"]) for e in every] == [
        *[("api", i) for i, _ in store.ledger("api")],
        *[("mail", i) for i, _ in store.ledger("mail")],
    ]
    with pytest.raises(ConfigurationError, match="already holds part files"):
        export(LedgerReader(redis_client), str(out))


def test_the_export_is_a_snapshot(redis_client: redis.Redis[Any]) -> None:
    """Entries appended while an export pages through a bucket are left for the next one."""
    store = RedisStore(redis_client, now_us=Clock(T_US))
    for i in range(10):
        store.grant(TaskCopy("api", f"t{i}", 0), Pace(I_US))
    entries = LedgerReader(redis_client).entries("api", chunk=3)
    got = [next(entries)]
    for i in range(10, 15):
        store.grant(TaskCopy("api", f"t{i}", 0), Pace(I_US))
    got += list(entries)
    assert [e["task"] for e in got] == [f"t{i}" for i in range(10)]


def test_since_on_the_store_clock(redis_client: redis.Redis[Any], tmp_path: Path) -> None:
    store = RedisStore(redis_client)  # Redis TIME, as in production
    reader = LedgerReader(redis_client)
    for i in range(3):
        store.grant(TaskCopy("api", f"old{i}", 0), Pace(I_US))
    time.sleep(0.05)
    cut_us = reader.now_us()
    for i in range(2):
        store.grant(TaskCopy("api", f"new{i}", 0), Pace(I_US))
    export(reader, str(tmp_path / "since.jsonl"), since_us=cut_us)
    assert [e["task"] for e in lines(tmp_path / "since.jsonl")] == ["new0", "new1"]
    assert all(e["now"] >= cut_us for e in lines(tmp_path / "since.jsonl"))
    export(reader, str(tmp_path / "none.jsonl"), since_us=reader.now_us() + 10**6)
    assert lines(tmp_path / "none.jsonl") == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90s", T_US - 90 * I_US),
        ("30m", T_US - 1800 * I_US),
        ("1.5h", T_US - 5400 * I_US),
        ("2d", T_US - 2 * 86400 * I_US),
        ("1700000000", 1_700_000_000 * I_US),
        ("1700000000.25", 1_700_000_000_250_000),
        ("2023-11-14T22:13:20Z", 1_700_000_000 * I_US),
        ("2023-11-14T22:13:20", 1_700_000_000 * I_US),
        ("2023-11-15T00:13:20+02:00", 1_700_000_000 * I_US),
    ],
)
def test_parse_since(text: str, expected: int) -> None:
    assert parse_since_us(text, T_US) == expected


@pytest.mark.parametrize("bad", ["yesterday", "10x", "-", "2023-13-01"])
def test_parse_since_names_bad_values(bad: str) -> None:
    with pytest.raises(ConfigurationError, match=f"--since={bad!r}"):
        parse_since_us(bad, T_US)


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, redis_server: Any, redis_client: Any) -> Any:
    """`celery -A cliapp interval ledger export …` in-process, on the private Redis."""
    monkeypatch.setenv("CLI_TEST_BROKER", redis_server.broker_url_for(4))
    monkeypatch.setenv("CLI_TEST_STORE", redis_server.url_for(0))
    from celery.bin.celery import celery

    def invoke(*args: str) -> Any:
        sys.modules.pop("tests.helpers.cliapp", None)
        return CliRunner().invoke(
            celery, ["-A", "tests.helpers.cliapp:app", "interval", "ledger", "export", *args]
        )

    return invoke


def test_cli_export(cli: Any, redis_client: redis.Redis[Any], tmp_path: Path) -> None:
    store = RedisStore(redis_client)
    run_ops(store, "api", 2)
    run_ops(store, "mail", 1)
    result = cli("--out", str(tmp_path / "all.jsonl"))
    assert result.exit_code == 0, result.output
    assert f"exported 10 entries of 2 buckets to {tmp_path / 'all.jsonl'}" in result.output
    result = cli("--out", str(tmp_path / "mail.jsonl"), "--bucket", "mail", "--since", "1h")
    assert result.exit_code == 0, result.output
    assert {e["bucket"] for e in lines(tmp_path / "mail.jsonl")} == {"mail"}
    result = cli("--out", str(tmp_path / "none.jsonl"), "--bucket", "nope")
    assert result.exit_code == 0 and "no ledger entries for bucket 'nope'" in result.output
    result = cli("--out", "-", "--bucket", "mail")
    assert result.exit_code == 0
    assert [json.loads(x)["bucket"] for x in result.stdout.splitlines()] == ["mail"] * 4


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--since", "last tuesday"), "'last tuesday'"),
        (("--bucket", ""), "''"),
        (("--chunk", "0"), "--chunk"),
    ],
)
def test_cli_export_bad_input(cli: Any, tmp_path: Path, args: tuple[str, ...], named: str) -> None:
    result = cli("--out", str(tmp_path / "x.jsonl"), *args)
    assert result.exit_code != 0
    assert named in result.output


def test_cli_export_needs_a_redis_store(
    cli: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CLI_TEST_STORE", "memory://")
    result = cli("--out", str(tmp_path / "x.jsonl"))
    assert result.exit_code != 0
    assert "interval_store_url='memory://' keeps no ledger" in result.output


# --- a Redis Cluster store: every master's ledgers ---


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[RedisProc]]:
    with three_masters() as nodes:
        yield nodes


def test_export_of_a_cluster_store_reads_every_master(
    cluster: list[RedisProc], tmp_path: Path
) -> None:
    flush(cluster)
    client = cluster_client_of(cluster)
    store = RedisStore(client, now_us=Clock(T_US))
    buckets = sorted(f"tenant-{i}" for i in range(30))
    for bucket in buckets:
        run_ops(store, bucket, 2)  # 2 grants, 2 claims, a pause and an unpause: 6 entries
    per_master = ledger_buckets_per_master(cluster)
    assert all(per_master) and set().union(*per_master) == set(buckets)
    reader = LedgerReader(client)
    assert reader.buckets() == buckets
    result = export(reader, str(tmp_path / "parts") + "/", chunk=4, part_entries=50)
    assert result.per_bucket == dict.fromkeys(buckets, 6)
    assert [len(lines(f)) for f in result.files] == [50, 50, 50, 30]
    written = [record for f in result.files for record in lines(f)]
    assert written == [entry_record(b, i, f) for b in buckets for i, f in store.ledger(b)]
    assert (tmp_path / "parts" / "_SUCCESS").exists()
    client.close()


@pytest.fixture
def cluster_cli(cli: Any, monkeypatch: pytest.MonkeyPatch, cluster: list[RedisProc]) -> Any:
    """The same command with the 3-master cluster as the app's store."""
    flush(cluster)
    monkeypatch.setenv("CLI_TEST_STORE", cluster_url(cluster))
    return cli


def test_cli_export_of_a_cluster_store(
    cluster_cli: Any, cluster: list[RedisProc], tmp_path: Path
) -> None:
    store = store_from_url(cluster_url(cluster))
    assert isinstance(store, RedisStore)
    buckets = ["api", "mail", *(f"api:t{i}" for i in range(8))]
    for bucket in buckets:
        run_ops(store, bucket, 1)  # 4 entries each
    assert sum(1 for found in ledger_buckets_per_master(cluster) if found) == 3
    result = cluster_cli("--out", str(tmp_path / "all.jsonl"))
    assert result.exit_code == 0, result.output
    assert f"exported 40 entries of 10 buckets to {tmp_path / 'all.jsonl'}" in result.output
    exported = lines(tmp_path / "all.jsonl")
    assert {b: sum(1 for e in exported if e["bucket"] == b) for b in buckets} == dict.fromkeys(
        buckets, 4
    )
    result = cluster_cli("--out", "-", "--bucket", "mail", "--since", "1h")
    assert result.exit_code == 0, result.output
    ops = [json.loads(x)["op"].split(":")[0] for x in result.stdout.splitlines()]
    assert ops == ["grant", "claim", "pause", "unpause"]  # a new bucket's claim waits on a Cluster
    store.close()
