"""The Spark audit of extra limits: every start judged by each limit its claim names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from celery_interval.cli import main as cli_main
from celery_interval.config.intervals import describe_rate, parse_interval_us
from tests.helpers.spark_data import Ledger, S, by_bucket, write_jsonl
from tests.helpers.spark_fixtures import require_spark, spark  # noqa: F401

#: "2/s" and ("6/min", 3) as a claim records them (``starts.LIMITS``).
LIMITS = "500000:1,10000000:3"


def limited(
    bucket: str, times_s: list[float], costs: dict[int, int] | None = None, limits: str = LIMITS
) -> Ledger:
    """Starts of a bucket with interval 0.1 s and the extra ``limits`` (costs by index)."""
    led = Ledger(bucket)
    for n, at_s in enumerate(times_s):
        extra: dict[str, Any] = {"limits": limits}
        if costs and n in costs:
            extra.update(burst=1, cost=costs[n])
        led.start(f"{bucket}-{n}", at_s, "w1@a", interval_us=S // 10, **extra)
    return led


def audit_of(spark: Any, path: Path) -> Any:  # noqa: F811
    from celery_interval.spark import audit

    return audit.audit(audit.read_ledgers(spark, [str(path)]))


def test_starts_within_every_limit_pass_and_one_too_many_is_named(
    spark: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """("6/min", 3): three starts at once, then one unit back each 10 s. ``ok`` keeps both
    limits (its 4 starts span 10.5 s: 4 <= 3 + 1.05), its entries twice over (an overlapping
    export: counted once). ``bad``'s 4th start comes at 9.9 s (4 > 3 + 0.99): the 2nd limit
    is broken, not "2/s" (every gap >= 0.5 s) nor the interval."""
    ok = limited("ok", [0.0, 0.5, 1.0, 10.5])
    bad = limited("bad", [0.0, 0.5, 1.0, 9.9, 30.0])
    path = write_jsonl(tmp_path / "limits.jsonl", [*ok.rows, *ok.rows, *bad.rows])
    frames = audit_of(spark, path)
    got = by_bucket(frames.summary.collect())
    assert (got["ok"]["violations"], got["ok"]["limit_violations"], got["ok"]["ok"]) == (0, 0, True)
    assert got["ok"]["limits"] == [
        {"limit": "2/s", "interval_s": 0.5, "burst": 1, "starts": 4, "violations": 0},
        {"limit": "6/min burst 3", "interval_s": 10.0, "burst": 3, "starts": 4, "violations": 0},
    ]
    assert (got["bad"]["violations"], got["bad"]["limit_violations"]) == (0, 1)
    assert got["bad"]["ok"] is False
    assert [(x["limit"], x["violations"]) for x in got["bad"]["limits"]] == [
        ("2/s", 0),
        ("6/min burst 3", 1),
    ]
    flagged = frames.limit_starts.where("violation").collect()
    assert [(r["bucket"], r["task"], r["limit"]) for r in flagged] == [
        ("bad", "bad-3", "6/min burst 3")
    ]


def test_a_start_costs_its_units_against_every_limit(
    spark: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """("1/s", 3) and ("6/min", 4): a start of cost 3 0.6 s after one of cost 1 spends 4
    units of the first (4 > 3 + 0.6: flagged; two starts of cost 1 would not be), not of the
    second (4 <= 4 + 0.06); another of cost 3 after 40 s breaks neither."""
    led = limited("costly", [0.0, 0.6, 40.0], {0: 1, 1: 3, 2: 3}, "1000000:3,10000000:4")
    frames = audit_of(spark, write_jsonl(tmp_path / "cost.jsonl", led.rows))
    flagged = frames.limit_starts.where("violation").collect()
    assert [(r["task"], r["limit"], r["cost"]) for r in flagged] == [("costly-1", "1/s burst 3", 3)]
    assert frames.limit_starts.count() == 6, "each start once per limit"


def test_the_audit_names_a_limit_as_status_does(spark: Any) -> None:  # noqa: F811
    """``spark.limits.rate_text`` gives ``describe_rate``'s text for every interval."""
    from pyspark.sql import functions as F

    from celery_interval.spark.limits import rate_text

    values = ["100/min", "1000/h", "10/s", "7/min", "128/s", "2s", "0.7s", "1/h", 86400, "3/s",
              "333/h", 0.000001, 1.5, "59/min"]  # fmt: skip
    intervals = [parse_interval_us(v) for v in values]
    df = spark.createDataFrame([(us,) for us in intervals], "us long")
    got = [r[0] for r in df.select(rate_text(F.col("us"))).collect()]
    assert got == [describe_rate(us) for us in intervals]
    assert got[:3] == ["100/min", "1000/h", "10/s"] and got[6] == "0.7s"


def test_cli_audit_names_the_broken_limit(
    spark: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    path = write_jsonl(tmp_path / "l.jsonl", limited("bad", [0.0, 0.5, 1.0, 9.9]).rows)
    out = tmp_path / "report"
    result = CliRunner().invoke(cli_main, ["audit", str(path), "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "FAIL bad: 4 starts, 0 violations" in result.output
    assert "limits (violations): 2/s: 0, 6/min burst 3: 1" in result.output
    doc = json.loads((out / "summary.json").read_text())
    assert doc["buckets"][0]["limit_violations"] == 1
    assert "6/min burst 3: 1" in (out / "report.html").read_text()


@pytest.mark.slow
def test_audit_of_a_real_run_with_limits(
    spark: Any,  # noqa: F811
    make_pool: Any,
    redis_client: Any,
    tmp_path: Path,
) -> None:
    """2 real workers, interval 50 ms and "8/s", 30 tasks at once: the exported ledger is
    audited clean, each start counted against "8/s" (a readmit too: the store counted it)."""
    from celery_interval.spark.audit import main
    from tests.helpers.pool import celery_cli

    require_spark()
    queue = "limited"
    pool = make_pool(
        0.05, broker="redis", queue=queue, conf={"interval_queues": {queue: {"limits": ["8/s"]}}}
    )
    pool.start(2, concurrency=2)
    ids = pool.send(30)
    assert sorted(r["id"] for r in pool.wait_records(30, timeout_s=60)) == sorted(ids)
    export = tmp_path / "ledger.jsonl"
    proc = celery_cli(pool, "interval", "ledger", "export", "--out", str(export))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = main([str(export)], tmp_path / "audit")
    (row,) = doc["buckets"]
    assert (row["starts"] - row["readmits"], row["violations"], row["ok"]) == (30, 0, True)
    assert row["limits"] == [
        {"limit": "8/s", "interval_s": 0.125, "burst": 1, "starts": row["starts"],
         "violations": 0},
    ]  # fmt: skip
    assert row["rate_per_s"] > 6, "the run kept near the limit's rate"
