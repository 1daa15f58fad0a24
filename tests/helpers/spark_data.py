"""Hand-built ledgers with known audit answers, written as the export writes them, for the
Spark audit's tests on every kind of session."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from celery_interval.demo.report import percentile

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


def check_known_answers(spark: Any, ledgers: list[str]) -> None:
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
