"""The Spark audit: hand-built ledgers with known answers, and the export of a real pool run."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from celery_interval.cli import main as cli_main
from tests.helpers.spark_data import (
    Ledger,
    S,
    by_bucket,
    check_known_answers,
    idle_ledger,
    ledgers,  # noqa: F401  (the fixture)
    write_jsonl,
)
from tests.helpers.spark_fixtures import require_spark, spark  # noqa: F401


def test_known_answers(spark: Any, ledgers: list[str]) -> None:  # noqa: F811
    check_known_answers(spark, ledgers)


def test_an_unset_interval_entry_gives_the_interval_of_the_starts_after_it(
    spark: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Claims that record no interval, after an override and its unset: the unset's entry (the
    configured interval again) governs them, not the dropped override."""
    from celery_interval.spark import audit

    led = Ledger("unset")
    led.control("set_interval", -1.0, interval_us=2 * S)
    led.start("u1", 0.0, "w1@a", interval_us=None)
    led.start("u2", 2.0, "w1@a", interval_us=None)  # 2 s >= 2 s
    led.control("unset_interval", 2.5, interval_us=S // 2)
    led.start("u3", 3.0, "w1@a", interval_us=None)  # 1 s >= 0.5 s
    led.start("u4", 3.5, "w1@a", interval_us=None)  # 0.5 s: less than the dropped 2 s
    path = write_jsonl(tmp_path / "unset.jsonl", led.rows)
    got = by_bucket(audit.audit(audit.read_ledgers(spark, [str(path)])).summary.collect())
    unset = got["unset"]
    assert (unset["interval_s"], unset["interval_source"]) == (0.5, "control")
    assert (unset["starts"], unset["violations"], unset["ok"]) == (4, 0, True)


def test_a_bucket_with_a_burst_is_judged_by_its_budget(
    spark: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Claims that record a burst (3) and costs: a burst back to back after an idle spell is
    no violation (the gap rule would see two); a start that overdraws the budget is one."""
    from celery_interval.spark import audit

    led = Ledger("burst")
    for task, at_s in (("b1", 0.0), ("b2", 0.0), ("b3", 0.0)):  # the whole burst at once
        led.start(task, at_s, "w1@a", burst=3)
    led.start("b4", 1.0, "w1@a", burst=3)  # one unit back after a second
    led.start("b5", 4.0, "w1@a", burst=3, cost=3)  # three units back by then
    led.start("b6", 4.5, "w1@a", burst=3)  # half a unit: overdrawn
    led.start("b7", 10.0, "w1@a", burst=3, cost=2)
    path = write_jsonl(tmp_path / "burst.jsonl", led.rows)
    got = by_bucket(audit.audit(audit.read_ledgers(spark, [str(path)])).summary.collect())
    assert (got["burst"]["starts"], got["burst"]["violations"]) == (7, 1)
    flagged = audit.audit(audit.read_ledgers(spark, [str(path)])).entries.where("violation")
    assert [r["task"] for r in flagged.collect()] == ["b6"]


def test_a_start_its_holder_missed_and_moved_is_at_its_new_time(
    spark: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A moved readmit puts its copy's missed start (the bucket's start just before) at its
    own time: no gap from the missed start, and the next start is measured from the moved one
    (with and without a burst). A moved readmit of another copy replaces nothing."""
    from celery_interval.spark import audit

    def audited(led: Ledger) -> tuple[int, int, list[str]]:
        path = write_jsonl(tmp_path / f"{led.bucket}.jsonl", led.rows)
        result = audit.audit(audit.read_ledgers(spark, [str(path)]))
        got = by_bucket(result.summary.collect())[led.bucket]
        flagged = [r["task"] for r in result.entries.where("violation").collect()]
        return got["starts"], got["violations"], flagged

    moved = {"readmit": 1, "moved": 1}
    led = Ledger("moved")
    led.start("m1", 0.0, "w1@a")
    led.start("m2", 1.0, "w1@a", holder="w1@a/00000000002a")
    led.start("m2", 1.4, "w1@a", holder="w1@a/00000000002a", **moved)  # 0.4 s after m2
    led.start("m3", 2.4, "w1@a")  # 1 s after the moved start
    led.start("m4", 3.4, "w1@a")
    led.start("m5", 3.6, "w1@a", **moved)  # not m4's copy: 0.2 s after m4
    assert audited(led) == (6, 1, ["m5"])
    led = Ledger("burst")
    led.start("b1", 0.0, "w1@a", burst=2)
    led.start("b2", 0.0, "w1@a", holder="w1@a/00000000002b", burst=2)
    led.start("b2", 0.5, "w1@a", holder="w1@a/00000000002b", burst=2, **moved)  # 3 in 0.5 s
    led.start("b3", 1.5, "w1@a", burst=2)
    led.start("b4", 2.5, "w1@a", burst=2)
    led.start("b5", 2.6, "w1@a", burst=2, **moved)  # not b4's copy: 5 units in 2.6 s
    assert audited(led) == (6, 1, ["b5"])


def test_a_start_its_holder_missed_then_run_by_another_is_no_duplicate(
    spark: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A holder told PAUSED under its lease (``missed=1``) has not run the task: another
    holder's start of it after a redelivery is its one run. A holder whose later OK (again, or
    a readmit) came counts again; a missed claim of another holder does not excuse one."""
    from celery_interval.spark import audit

    led = Ledger("mis")
    led.start("a", 0.0, "w1@a", holder="w1@a/0000000000aa")
    led.add("claim:PAUSED", 0.2, task="a", r=0, holder="w1@a/0000000000aa", missed=1)
    led.add("claim:PAUSED", 5.2, task="a", r=0, holder="w1@a/0000000000aa", missed=1)
    led.start("a", 9.0, "w2@b")  # redelivered after an outage: its one run
    led.start("b", 1.0, "w1@a", holder="w1@a/0000000000bb")
    led.add("claim:PAUSED", 1.2, task="b", r=0, holder="w1@a/0000000000bb", missed=1)
    led.start("b", 10.0, "w1@a", holder="w1@a/0000000000bb", again=1)  # w1 ran it after all
    led.start("b", 11.0, "w2@b")  # a second run: a duplicate
    led.start("d", 3.0, "w1@a", holder="w1@a/0000000000dd")
    led.add("claim:PAUSED", 3.2, task="d", r=0, holder="w1@a/0000000000dd", missed=1)
    led.start("d", 13.0, "w1@a", holder="w1@a/0000000000dd", readmit=1)  # its readmit: one run
    led.start("e", 4.0, "w1@a", holder="w1@a/0000000000ee")
    led.add("claim:PAUSED", 4.2, task="e", r=0, holder="w1@a/0000000000ee", missed=1)
    # The store's clock gave the OK again the PAUSED's time: the stream's order says it came later.
    led.add("claim:OK", 4.2, task="e", r=0, holder="w1@a/0000000000ee", again=1)
    led.start("e", 14.0, "w2@b")  # w1 ran it: a duplicate
    led.start("c", 2.0, "w1@a")
    led.add("claim:PAUSED", 2.2, task="c", r=0, holder="w9@z/0000000000cc", missed=1)
    led.start("c", 12.0, "w2@b")  # the missed claim was another holder's: a duplicate
    path = write_jsonl(tmp_path / "mis.jsonl", led.rows)
    got = by_bucket(audit.audit(audit.read_ledgers(spark, [str(path)])).summary.collect())
    assert (got["mis"]["duplicate_starts"], got["mis"]["duplicate_tasks"]) == (3, ["b", "c", "e"])


def test_a_throttled_task_run_again_is_no_duplicate(
    spark: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A task throttled (429) runs again under a new delivery: one more start per throttle
    entry is its run, a start beyond that is a duplicate."""
    from celery_interval.spark import audit

    led = Ledger("thr")
    led.start("a", 0.0, "w1@a")
    led.add("throttle", 0.1, task="a", r=0, ticket=1, retry_after=2 * S, interval=S)
    led.start("b", 3.0, "w1@a")  # waited the retry_after
    led.start("a", 4.0, "w2@b")  # the throttled task's run: no duplicate
    led.start("c", 5.0, "w1@a")
    led.start("c", 6.0, "w2@b")  # no throttle: a duplicate
    path = write_jsonl(tmp_path / "thr.jsonl", led.rows)
    got = by_bucket(audit.audit(audit.read_ledgers(spark, [str(path)])).summary.collect())
    assert (got["thr"]["starts"], got["thr"]["duplicate_starts"]) == (5, 1)
    assert got["thr"]["duplicate_tasks"] == ["c"]


def test_repeats_are_dropped_alike_by_normalize_and_by_the_audit(
    spark: Any,  # noqa: F811
    ledgers: list[str],  # noqa: F811
) -> None:
    """The overlapping export's 10 repeated entries: ``normalize`` drops them in a pass of its
    own (``dedupe``), the audit in its one window pass; the starts are the same either way."""
    from celery_interval.spark import audit, entries

    raw = audit.read_ledgers(spark, ledgers)
    assert entries.keyed(raw).count() - entries.normalize(raw).count() == 10
    fields = ("bucket", "task", "start_us", "prev_task", "gap_us", "violation")
    apart = entries.starts_of(entries.normalize(raw)).select(*fields).collect()
    fused = audit.audit(raw).entries.where("is_start")
    in_one_pass = fused.withColumnRenamed("start_key", "start_us").select(*fields).collect()
    assert Counter(map(tuple, apart)) == Counter(map(tuple, in_one_pass)) and len(apart) > 10


@pytest.mark.parametrize("adaptive", ["true", "false"])
def test_the_five_parts_read_one_shuffle(
    spark: Any,  # noqa: F811
    ledgers: list[str],  # noqa: F811
    adaptive: str,
) -> None:
    """The timeline, the sketches, the counted entries, the duplicate starts and the extra
    limits' checks share one scan and one shuffle of the ledger: the optimizer may not push a
    part's filter or its choice of columns below it (each would be a scan of its own). With
    adaptive execution (Spark's default) and without (``build_session``'s)."""
    from celery_interval.spark import audit

    before = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", adaptive)
    try:
        cube = audit.audit(audit.read_ledgers(spark, ledgers)).cube
        cube.collect()
        plan = cube._jdf.queryExecution().executedPlan().toString()
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", before)
    final = plan.split("== Initial Plan ==")[0]
    assert final.count("ReusedExchange") == 4, plan
    assert final.count("FileScan") == 1, plan


def test_interval_of_overrides_and_unknown_intervals(
    spark: Any,  # noqa: F811
    ledgers: list[str],  # noqa: F811
) -> None:
    from celery_interval.spark import audit

    raw = audit.read_ledgers(spark, ledgers)
    got = by_bucket(audit.audit(raw, {"api": S // 2}).summary.collect())
    api = got["api"]
    assert (api["interval_s"], api["interval_source"], api["violations"]) == (
        0.5, "--interval-of", 0,
    )  # fmt: skip
    assert api["ok"] is False, "the duplicate start still fails the bucket"
    mail = got["mail"]  # no interval anywhere: unknown is no pass
    assert (mail["interval_s"], mail["violations"], mail["ok"]) == (None, None, False)
    assert got["old"]["interval_source"] == "control", "--interval-of overrides only its bucket"


def test_cli_audit_writes_summary_plots_and_report(
    spark: Any,  # noqa: F811
    ledgers: list[str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """`celery-interval audit`, in-process so that it reuses the session (a JVM per test
    would cost ~10 s); exit status 1 as a bucket fails."""
    import pyarrow.parquet as pq

    out = tmp_path / "report"
    argv = ["audit", *ledgers, "--out", str(out), "--interval-of", "mail=2"]
    result = CliRunner().invoke(cli_main, argv)
    assert result.exit_code == 1, result.output
    assert "FAIL api: 10 starts, 1 violations, 1 duplicate starts" in result.output
    assert "ok   idle: 0 starts" in result.output
    assert spark.sparkContext._jsc is not None, "a session the audit did not start runs on"

    doc = json.loads((out / "summary.json").read_text())
    assert doc["ok"] is False and doc["intervals_of"] == {"mail": 2.0}
    assert doc["entries"] == 28 + 4 + 8 + 3
    rows = by_bucket(doc["buckets"])
    assert (rows["mail"]["violations"], rows["mail"]["min_gap_s"]) == (1, 1.999999)
    for row in doc["buckets"]:
        for key in ("bucket", "starts", "violations", "min_gap_s", "late_p99_s", "workers"):
            assert key in row
    table = pq.read_table(out / "summary.parquet").to_pylist()
    assert [(r["bucket"], r["starts"], r["violations"]) for r in table] == [
        (r["bucket"], r["starts"], r["violations"]) for r in doc["buckets"]
    ]
    pngs = sorted(p.name for p in out.glob("*.png"))
    # api, mail and old have gaps (failing first, then the busiest); idle has no start
    assert pngs == [
        *[f"bucket-00{n}-{kind}.png" for n in range(3) for kind in ("gaps", "lateness")],
        "workers.png",
    ]
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
    html = (out / "report.html").read_text()
    for name in [*pngs, "api", "mail", "old", "idle", "started more than once: t2"]:
        assert name in html


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["nope.jsonl"], "'nope.jsonl'"),
        (["LEDGER", "--interval-of", "api"], "'api'"),
        (["LEDGER", "--interval-of", "=2"], "'=2'"),
        (["LEDGER", "--interval-of", "api=fast"], "'fast'"),
        (["LEDGER", "--interval-of", "api=0"], "'0'"),
        (["LEDGER", "--conf", "spark.driver.memory"], "'spark.driver.memory'"),
    ],
)
def test_cli_audit_bad_input(tmp_path: Path, args: list[str], named: str) -> None:
    ledger = write_jsonl(tmp_path / "l.jsonl", idle_ledger().rows)
    argv = ["audit", *[str(ledger) if a == "LEDGER" else a for a in args], "--out", str(tmp_path)]
    result = CliRunner().invoke(cli_main, argv)
    assert result.exit_code == 2, result.output
    assert named in result.output


def test_cli_audit_of_a_malformed_ledger(spark: Any, tmp_path: Path) -> None:  # noqa: F811
    ledger = write_jsonl(tmp_path / "l.jsonl", idle_ledger().rows)
    with ledger.open("a") as f:
        f.write('{"bucket": "idle", "op": "pause", "now": "not a number"}\n')
    result = CliRunner().invoke(cli_main, ["audit", str(ledger), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1, result.output
    assert "the Spark audit failed" in result.output and "l.jsonl" in result.output


def test_cli_audit_without_pyspark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = write_jsonl(tmp_path / "l.jsonl", idle_ledger().rows)
    monkeypatch.setitem(sys.modules, "pyspark", None)
    result = CliRunner().invoke(cli_main, ["audit", str(ledger), "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "pip install 'celery-interval[spark]'" in result.output


@pytest.mark.slow
def test_audit_of_a_real_pool_run(
    spark: Any,  # noqa: F811
    make_pool: Any,
    redis_client: Any,
    tmp_path: Path,
) -> None:
    """3 real workers, 60 tasks, the ledger exported by the real `celery … interval ledger
    export` command line, then audited: every task started once, none too early. The store's
    database starts empty (``redis_client`` flushes it): the export holds this run alone."""
    from celery_interval.spark.audit import main
    from tests.helpers.pool import celery_cli

    require_spark()
    pool = make_pool(0.02, broker="redis")
    workers = pool.start(3)
    ids = pool.send(60)
    records = pool.wait_records(60)
    assert sorted(r["id"] for r in records) == sorted(ids)
    export = tmp_path / "ledger.jsonl"
    proc = celery_cli(pool, "interval", "ledger", "export", "--out", str(export))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"to {export}" in proc.stdout
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    assert {line["bucket"] for line in lines} == {pool.queue}

    doc = main([str(export)], tmp_path / "audit")
    (row,) = doc["buckets"]
    # A pool process that reaches its task after the admitted start (a loaded host) claims a
    # new start for it: a readmit, one body, two admitted starts.
    assert (row["bucket"], row["starts"] - row["readmits"], row["violations"]) == (
        pool.queue,
        60,
        0,
    )
    assert (row["duplicate_starts"], row["ok"], doc["ok"]) == (0, True, True)
    assert (row["interval_s"], row["interval_source"]) == (0.02, "ledger")
    assert row["min_gap_s"] >= 0.02 and row["grants"] >= 60  # a re-ticket is granted again
    names = {w.name for w in workers}
    assert {w["worker"] for w in row["workers"]} <= names
    assert sum(w["starts"] for w in row["workers"]) == row["starts"]
    assert row["utilization"] > 0.5
    assert (tmp_path / "audit" / "bucket-000-gaps.png").exists()
