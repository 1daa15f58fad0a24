"""The Spark audit: hand-built ledgers with known answers, and the export of a real pool run."""

from __future__ import annotations

import json
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from celery_interval.cli import main as cli_main
from celery_interval.demo.report import percentile
from tests.helpers.spark_fixtures import require_spark, spark  # noqa: F401

S = 1_000_000  # µs per second
T0 = 1_800_000_000_000_000


class Ledger:
    """Entries of one bucket as the export writes them (``ledger.entry_record``)."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self.rows: list[dict[str, Any]] = []

    def add(self, op: str, at_s: float, **fields: Any) -> dict[str, Any]:
        now = T0 + round(at_s * S)
        row = {"bucket": self.bucket, "id": f"{now // 1000}-{len(self.rows)}", "op": op,
               "now": now, **fields}  # fmt: skip
        self.rows.append(row)
        return row

    def start(
        self,
        task: str,
        at_s: float,
        worker: str,
        late_us: int = 0,
        r: int = 0,
        interval_us: int | None = S,
        holder: str = "",
        **extra: Any,
    ) -> None:
        """A claim:OK made 3 ms before the start it admits (gaps use the start, not now)."""
        start = T0 + round(at_s * S)
        holder = holder or f"{worker}/{uuid.uuid4().hex[:12]}"  # one holder per delivery
        fields = {"task": task, "r": r, "slot": start - late_us, "start": start,
                  "late": late_us, "holder": holder}  # fmt: skip
        if interval_us is not None:
            fields["interval"] = interval_us
        self.add("claim:OK", at_s - 0.003, **fields, **extra)

    def control(self, op: str, at_s: float, changed: int = 1, interval_us: int = S) -> None:
        self.add(op, at_s, changed=changed, interval=interval_us, paused=int(op == "pause"))


API_LATE_US = [0, 2_000, 100, 0, 1_000, 7_000, 50, 300, 0, 400]


def api_ledger() -> Ledger:
    """Interval 1 s on every claim; a violation (t4, 0.5 s after t3), a duplicate start (t2
    twice), a retry that is no duplicate (t6 r=1), a readmitted start that is none either
    (t7: the same holder), a pause 3 s to 6 s, every other outcome."""
    led = Ledger("api")
    for n in range(1, 7):
        led.add("grant:OK", -1 + n / 100, task=f"t{n}", r=0, interval=S)
    led.add("grant:DUPLICATE", -0.5, task="t1", r=0, interval=S)
    led.add("grant:OK", -0.4, task="t2", r=0, interval=S, again=1)  # a copy's slot again
    times = [0.0, 1.0, 2.0, 2.5, 6.5, 8.0, 9.0, 10.0]
    tasks = [("t1", 0, "w1@a"), ("t2", 0, "w2@b"), ("t3", 0, "w1@a"), ("t4", 0, "w2@b"),
             ("t5", 0, "w1@a"), ("t2", 0, "w2@b"), ("t6", 0, "w2@b"),
             ("t6", 1, "w3@c")]  # fmt: skip
    for (task, r, worker), at_s, late in zip(tasks, times, API_LATE_US):
        led.start(task, at_s, worker, late, r)
    led.start("t7", 11.0, "w1@a", 0, holder="w1@a/00000000007a")
    led.start("t7", 12.0, "w1@a", 400, holder="w1@a/00000000007a", readmit=1)
    led.start("t1", 0.001, "w1@a", 0, again=1)  # a re-claim of its own lease: no start
    for op in ("claim:WAIT", "claim:WAIT", "claim:HELD", "claim:RETICKET", "claim:PAUSED",
               "claim:DUPLICATE"):  # fmt: skip
        led.add(op, 0.5, task="tx", r=0, interval=S)
    led.control("pause", 3.0)
    led.control("pause", 3.5, changed=0)  # already paused: no new window
    led.control("unpause", 6.0)
    return led


def mail_ledger() -> Ledger:
    """No interval recorded anywhere (an old ledger): audited with --interval-of mail=2."""
    led = Ledger("mail")
    for n, at_s in enumerate([0.0, 2.0, 3.999999, 7.0]):
        led.start(f"m{n}", at_s, "w1@a", interval_us=None)
    return led


def old_ledger() -> Ledger:
    """Claims without an interval; set_interval entries set 0.5 s, then 1 s; a pause ended by
    a reset."""
    led = Ledger("old")
    led.control("set_interval", -1.0, interval_us=S // 2)
    led.start("o1", 0.0, "w1@a", interval_us=None)
    led.start("o2", 0.6, "w1@a", interval_us=None)  # 0.6 >= 0.5
    led.control("set_interval", 1.0, interval_us=S)
    led.start("o3", 1.7, "w2@b", interval_us=None)  # 1.1 >= 1
    led.start("o4", 2.4, "w2@b", interval_us=None)  # 0.7 < 1: a violation
    led.control("pause", 3.0)
    led.add("reset", 5.0)
    return led


def idle_ledger() -> Ledger:
    led = Ledger("idle")
    led.control("pause", 1.0)
    led.control("unpause", 2.0)
    led.add("grant:OK", 2.5, task="i1", r=0, interval=S)
    return led


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def ledgers(tmp_path: Path) -> list[str]:
    """Two overlapping exports: every bucket, then the api bucket's first entries again (the
    same entries: an export copies them)."""
    api = api_ledger().rows
    rows = [*api, *mail_ledger().rows, *old_ledger().rows, *idle_ledger().rows]
    first = write_jsonl(tmp_path / "export-1.jsonl", rows)
    again = tmp_path / "export-2"
    again.mkdir()
    write_jsonl(again / "part-00000.jsonl", api[:10])
    return [str(first), str(again)]


def by_bucket(rows: list[Any]) -> dict[str, dict[str, Any]]:
    return {r["bucket"]: (r if isinstance(r, dict) else r.asDict(recursive=True)) for r in rows}


def test_known_answers(spark: Any, ledgers: list[str]) -> None:  # noqa: F811
    check_known_answers(spark, ledgers)


def check_known_answers(spark: Any, ledgers: list[str]) -> None:  # noqa: F811
    """The audit of ``ledgers`` on ``spark`` (a local, cluster or Spark Connect session)."""
    from celery_interval.spark import audit, checks, entries

    raw = audit.read_ledgers(spark, ledgers)
    frames = audit.audit(raw, {"mail": 2 * S})
    got = by_bucket(frames.summary.collect())
    assert sorted(got) == ["api", "idle", "mail", "old"]

    api = got["api"]
    gaps_s = [1.0, 1.0, 0.5, 4.0, 1.5, 1.0, 1.0, 1.0, 1.0]
    assert (api["starts"], api["violations"], api["duplicate_starts"]) == (10, 1, 1)
    assert api["duplicate_tasks"] == ["t2"] and api["ok"] is False
    assert api["min_gap_s"] == 0.5
    assert (api["p1_gap_s"], api["p50_gap_s"]) == (percentile(gaps_s, 1), percentile(gaps_s, 50))
    for q in (50, 95, 99):
        assert api[f"late_p{q}_s"] == percentile(API_LATE_US, q) / S
    assert api["late_max_s"] == max(API_LATE_US) / S
    assert (api["interval_s"], api["interval_source"], api["configured_rate_per_s"]) == (
        1.0, "ledger", 1.0,
    )  # fmt: skip
    assert (api["span_s"], api["pauses"], api["paused_s"]) == (12.0, 1, 3.0)
    assert api["pause_windows"] == [{"start_us": T0 + 3 * S, "end_us": T0 + 6 * S}]
    assert api["rate_per_s"] == pytest.approx(9 / 9) and api["utilization"] == pytest.approx(1.0)
    assert (api["grants"], api["regrants"], api["waits"], api["held"]) == (6, 1, 2, 1)
    assert (api["retickets"], api["paused_claims"], api["dedupe_drops"]) == (1, 1, 2)
    assert (api["reclaims"], api["readmits"]) == (1, 1)
    assert api["entries"] == 8 + 11 + 6 + 3, "the second, overlapping export counts once"
    workers = [(w["worker"], w["starts"], w["share"]) for w in api["workers"]]
    assert workers == [("w1@a", 5, 0.5), ("w2@b", 4, 0.4), ("w3@c", 1, 0.1)]

    mail = got["mail"]
    assert (mail["interval_s"], mail["interval_source"]) == (2.0, "--interval-of")
    assert (mail["violations"], mail["min_gap_s"], mail["ok"]) == (1, 1.999999, False)

    old = got["old"]
    assert (old["interval_s"], old["interval_source"], old["violations"]) == (1.0, "control", 1)
    assert old["pause_windows"] == [{"start_us": T0 + 3 * S, "end_us": T0 + 5 * S}]
    assert old["paused_s"] == 0.0, "the pause began after the last start"

    idle = got["idle"]
    assert (idle["starts"], idle["violations"], idle["ok"], idle["pauses"]) == (0, 0, True, 1)
    assert idle["paused_s"] == 0.0, "no span of starts, no paused time inside it"

    hist = checks.gap_histogram(frames.cube.where("bucket = 'mail'")).orderBy("bin").collect()
    edges = [(r["lo_s"], r["hi_s"], r["gaps"]) for r in hist if r["gaps"]]
    # 1.999999 s, 2.0 s and 3.0 s in tenths of the 2 s interval: split at the interval exactly
    assert edges == [(1.8, 2.0, 1), (2.0, 2.2, 1), (3.0, 3.2, 1)]
    assert len(hist) == entries.HIST_BINS and hist[-1]["lo_s"] == 8.0, "the last: 4 intervals+"

    violating = frames.entries.where("violation").orderBy("bucket").collect()
    assert [(r["bucket"], r["task"], r["prev_task"], r["gap_us"]) for r in violating] == [
        ("api", "t4", "t3", S // 2),
        ("mail", "m2", "m1", 2 * S - 1),
        ("old", "o4", "o3", 7 * S // 10),
    ]


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
    ledgers: list[str],
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
    ledgers: list[str],
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
    ledgers: list[str],
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
    ledgers: list[str],
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
