"""The ledger audit: pure DataFrame -> DataFrame transforms, with the I/O only in ``main``.

A *start* is a ``claim:OK`` entry (a holder's re-claim of its own lease, ``again=1``, is
not). Gaps are measured between the starts the claims admitted (``start``, store real µs),
not between the claims (``now``): a claim may come up to ``lead`` before the start it admits,
and the interval governs starts. The interval a gap must clear is the later start's: from
``--interval-of`` when given, else the ``interval`` the claim entry records, else the one the
latest control entry (pause, unpause, set_interval) recorded before it.

The heavy part is one pass: the entries are read and shuffled by bucket once. The
*timeline* (starts and control actions) is then sorted by time (duplicates from overlapping
exports are adjacent and dropped, gaps and pauses come from running windows) and folded into a
small *cube* of numbers per (bucket, worker, second), and into percentile sketches and gap
counts per (bucket, histogram bin). Every other entry (most of a ledger: grants, waits)
is only counted, once per (bucket, id), without a sort; so are the holders of each started
task. Everything else is computed from the cube.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

__all__ = [
    "AUDIT_FIELDS",
    "HIST_BINS",
    "HIST_PER_INTERVAL",
    "KINDS",
    "LEDGER_SCHEMA",
    "AuditFrames",
    "annotate",
    "audit",
    "build_session",
    "counted_cells",
    "cube_of",
    "dedupe",
    "duplicate_cells",
    "gap_histogram",
    "keyed",
    "kind_of",
    "lateness_series",
    "main",
    "normalize",
    "on_timeline",
    "read_ledgers",
    "sketch_cells",
    "starts_of",
    "summary",
    "typed_columns",
    "union_cells",
    "worker_of",
    "worker_shares",
]

_TEXT = ("bucket", "id", "op", "task", "holder")
_NUMBERS = ("now", "r", "ticket", "slot", "delay", "epoch", "paused", "start", "late", "again")
_NUMBERS_TOO = ("changed", "interval", "readmit")
#: Every field an exported entry may carry (``ledger.entry_record``), typed.
LEDGER_SCHEMA = StructType(
    [StructField(n, StringType()) for n in _TEXT]
    + [StructField(n, LongType()) for n in (*_NUMBERS, *_NUMBERS_TOO)]
)
#: The fields the audit reads.
AUDIT_FIELDS = (
    "bucket", "id", "op", "now", "task", "r", "holder", "start", "late", "again",
    "changed", "interval", "readmit",
)  # fmt: skip
#: The KLL sketch size of a bucket's percentiles: exact (nearest rank) up to about k values,
#: then a rank error of about 0.01 %.
KLL_K = 20_000
#: Lateness over time is kept per second of store time, per bucket and worker.
TBIN_US = 1_000_000
#: The gap histogram: bins of a tenth of the interval, the last one for 4 intervals and more.
HIST_PER_INTERVAL = 10
HIST_BINS = 4 * HIST_PER_INTERVAL + 1
_CONTROLS = ("pause", "unpause", "set_interval")
#: Besides starts, the entries the running windows read: intervals set, pauses opened, closed.
_TIMELINE_OPS = (*_CONTROLS, "reset")
#: The fields only a start's later steps read.
_START_FIELDS = ("task", "r", "holder", "late", "readmit")
#: Where a start's interval came from; entries carry the index (numbers aggregate faster).
SOURCES = ("--interval-of", "ledger", "control")


def _count_if(condition: Column) -> Column:
    return F.sum(F.when(condition, 1).otherwise(0))


def _seconds(us: Column) -> Column:
    return us.cast("double") / 1e6


def _flag(name: str) -> Column:
    return F.coalesce(F.col(name), F.lit(0)) == 1


def typed_columns(df: DataFrame, names: Sequence[str]) -> DataFrame:
    """Exactly the columns ``names`` of ``df``, typed as in ``LEDGER_SCHEMA`` (absent: null)."""
    types = {f.name: f.dataType for f in LEDGER_SCHEMA.fields}
    present = set(df.columns)
    return df.select(
        *[
            (F.col(name) if name in present else F.lit(None)).cast(types[name]).alias(name)
            for name in names
        ]
    )


def _by_time() -> Any:
    return Window.partitionBy("bucket").orderBy("start_key", "id")


def keyed(raw: DataFrame) -> DataFrame:
    """The audited fields, typed, plus ``is_start``, ``kind`` and ``start_key`` (the admitted
    start of a start, else ``now``), shuffled by bucket; entries without bucket, op or now are
    dropped. Only what a later step reads crosses the shuffle: ``op`` of the timeline's
    entries, the start fields of starts. Overlapping exports' repeats of an entry (bucket, id)
    are still there."""
    valid = F.col("bucket").isNotNull() & F.col("op").isNotNull() & F.col("now").isNotNull()
    # An entry without an id (a hand-made ledger) is never taken for another one.
    unique_id = F.concat(F.lit("row-"), F.monotonically_increasing_id().cast("string"))
    is_start = (F.col("op") == "claim:OK") & ~_flag("again")
    is_control = F.col("op").isin(*_TIMELINE_OPS)
    return (
        typed_columns(raw, AUDIT_FIELDS)
        .where(valid)
        .select(
            "bucket",
            "now",
            F.coalesce(F.col("id"), unique_id).alias("id"),
            F.when(is_start | is_control, F.col("op")).alias("op"),
            *[F.when(is_start, F.col(n)).alias(n) for n in _START_FIELDS],
            F.when(is_start | is_control, F.col("interval")).alias("interval"),
            F.when(is_control, F.col("changed")).alias("changed"),
            is_start.alias("is_start"),
            kind_of().alias("kind"),
            F.when(is_start, F.coalesce(F.col("start"), F.col("now")))
            .otherwise(F.col("now"))
            .alias("start_key"),
        )
        .repartition("bucket")
    )


def on_timeline() -> Column:
    """Whether an entry (of ``keyed``) is a start or a control action: what the running
    windows read (``keyed`` keeps ``op`` for those only)."""
    return F.col("op").isNotNull()


def _is_repeat() -> Column:
    """Whether an entry repeats the one before it in time: both copies of an entry (bucket,
    id) that overlapping exports hold share (start_key, id), so they are adjacent."""
    return F.coalesce(F.lag("id").over(_by_time()) == F.col("id"), F.lit(False))


def dedupe(entries: DataFrame) -> DataFrame:
    """``entries`` (of ``keyed``) without the repeats of an entry (bucket, id) that
    overlapping exports both hold."""
    return entries.withColumn("repeat", _is_repeat()).where(~F.col("repeat")).drop("repeat")


def normalize(raw: DataFrame) -> DataFrame:
    """Every valid entry of ``raw`` once, typed, with ``is_start`` and ``start_key``."""
    return dedupe(keyed(raw))


def worker_of(holder: Column) -> Column:
    """The worker of a claim's holder (``<hostname>/<12 hex digits>``, one per delivery)."""
    return F.regexp_replace(holder, r"/[0-9a-f]{12}$", "")


def annotate(ledger: DataFrame, intervals_us: Mapping[str, int] | None = None) -> DataFrame:
    """Every entry of a ``normalize``-d ledger (or of ``keyed``: repeats of an entry are
    dropped in the same pass, see ``dedupe``) with, for starts: interval_us and its
    interval_source, prev_start_us, prev_task, gap_us, violation (gap_us < interval_us;
    null for a bucket's first start or an unknown interval), worker, tbin (second since the
    bucket's first start) and hbin (histogram bin); for the close of a pause: pause_from_us and
    pause_to_us; for a pause or a close: event_code (now x 2, + 1 for a pause)."""
    w = _by_time()
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    upto = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    start, is_start = F.col("start_key"), F.col("is_start")
    op = F.col("op")
    is_open = (op == "pause") & _flag("changed")
    is_close = ((op == "unpause") & _flag("changed")) | (op == "reset")
    control = op.isin(*_CONTROLS) & F.col("interval").isNotNull()
    # One window pass: a repeat (the copy of the row before it, see ``dedupe``) leaves every
    # running value of the rows after it as it was, so it is dropped after the pass.
    running = ledger.select(
        "*",
        _is_repeat().alias("_repeat"),
        F.last(F.when(control, F.col("interval")), ignorenulls=True).over(upto).alias("c_iv"),
        F.last(F.when(is_start, start), ignorenulls=True).over(before).alias("prev_start_us"),
        F.last(F.when(is_start, F.col("task")), ignorenulls=True).over(before).alias("prev_task"),
        F.first(F.when(is_start, start), ignorenulls=True).over(upto).alias("t0"),
        F.last(F.when(is_open | is_close, F.struct(is_open.alias("open"), F.col("now"))), True)
        .over(before)
        .alias("last_event"),
    )
    if intervals_us:
        pairs = [F.lit(x) for bucket, us in sorted(intervals_us.items()) for x in (bucket, us)]
        override = F.create_map(*pairs)[F.col("bucket")].cast(LongType())
    else:
        override = F.lit(None).cast(LongType())
    interval_us = F.when(is_start, F.coalesce(override, F.col("interval"), F.col("c_iv")))
    gap_us = F.when(is_start, start - F.col("prev_start_us"))
    hbin = F.when(  # (least() skips nulls: a first start would land in the last bin)
        gap_us.isNotNull() & interval_us.isNotNull(),
        F.least(F.floor(gap_us * HIST_PER_INTERVAL / interval_us), F.lit(HIST_BINS - 1)),
    )
    last_event = F.col("last_event")
    shaped = running.where(~F.col("_repeat")).select(
        *ledger.columns,
        F.when(is_start, F.col("prev_start_us")).alias("prev_start_us"),
        F.when(is_start, F.col("prev_task")).alias("prev_task"),
        interval_us.alias("interval_us"),
        F.when(is_start & override.isNotNull(), SOURCES.index("--interval-of"))
        .when(is_start & F.col("interval").isNotNull(), SOURCES.index("ledger"))
        .when(is_start & F.col("c_iv").isNotNull(), SOURCES.index("control"))
        .alias("interval_source"),
        gap_us.alias("gap_us"),
        (gap_us < interval_us).alias("violation"),
        F.when(is_start, worker_of(F.col("holder"))).alias("worker"),
        F.when(is_start, F.floor((start - F.col("t0")) / TBIN_US)).alias("tbin"),
        hbin.cast("int").alias("hbin"),
        F.when(is_close & last_event["open"], last_event["now"]).alias("pause_from_us"),
        F.when(is_close & last_event["open"], F.col("now")).alias("pause_to_us"),
        # the last pause or close wins: now x 2 + 1 for a pause (max() of it is the latest)
        F.when(is_open | is_close, F.col("now") * 2 + is_open.cast("long")).alias("event_code"),
    )
    return shaped


def starts_of(ledger: DataFrame, intervals_us: Mapping[str, int] | None = None) -> DataFrame:
    """The starts of a ``normalize``-d ledger with their ``annotate`` columns (a drill-down:
    which start broke the interval, after which one)."""
    return (
        annotate(ledger, intervals_us)
        .where("is_start")
        .withColumnRenamed("start_key", "start_us")
        .withColumnRenamed("late", "late_us")
    )


#: The outcomes an entry is counted under (at most one each), by ``kind`` (their index).
KINDS = ("grants", "regrants", "waits", "held", "paused_claims", "retickets", "dedupe_drops",
         "reclaims")  # fmt: skip


def kind_of() -> Column:
    """The index in ``KINDS`` of the outcome an entry counts under (null: none). A number,
    so that the aggregations over it stay hash-based."""
    op, again = F.col("op"), _flag("again")
    kinds = {
        "grants": (op == "grant:OK") & ~again,
        "regrants": (op == "grant:OK") & again,
        "waits": op == "claim:WAIT",
        "held": op.isin("grant:HELD", "claim:HELD"),
        "paused_claims": op == "claim:PAUSED",
        "retickets": op == "claim:RETICKET",
        "dedupe_drops": op.isin("grant:DUPLICATE", "claim:DUPLICATE"),
        "reclaims": (op == "claim:OK") & again,
    }
    chosen = F.lit(None).cast("int")
    for n, name in reversed(list(enumerate(KINDS))):
        chosen = F.when(kinds[name], F.lit(n)).otherwise(chosen)
    return chosen


def _entry_span() -> list[Column]:
    """The aggregates of any cell: its entries and their time span."""
    return [
        F.count(F.lit(1)).alias("entries"),
        F.min("now").alias("first_entry_us"),
        F.max("now").alias("last_entry_us"),
    ]


def _entry_counts() -> list[Column]:
    """``_entry_span`` and the entries' counts by outcome (``KINDS``)."""
    kind = F.col("kind")
    return [*_entry_span(), *[_count_if(kind == n).alias(name) for n, name in enumerate(KINDS)]]


def cube_of(entries: DataFrame) -> DataFrame:
    """``annotate``-d entries folded per (bucket, worker, tbin, pause_to_us): starts by worker
    and second, each closed pause alone, every other entry in one cell per bucket (the three
    null). Only numbers, so the aggregation is hash-based and compiled: the cells are many
    (the percentiles' sketches are per bucket, in ``sketch_cells``)."""
    is_start = F.col("is_start")
    gap = F.col("gap_us")
    late = F.when(is_start, F.col("late"))
    start_at = F.when(is_start, F.col("start_key"))
    return entries.groupBy("bucket", "worker", "tbin", "pause_to_us").agg(
        *_entry_span(),
        _count_if(is_start & _flag("readmit")).alias("readmits"),
        _count_if(is_start).alias("starts"),
        F.min(start_at).alias("first_start_us"),
        F.max(start_at).alias("last_start_us"),
        F.min(gap).alias("min_gap_us"),
        F.count(gap).alias("gaps"),
        _count_if(gap.isNotNull() & F.col("interval_us").isNull()).alias("unknown_gaps"),
        _count_if(F.col("violation")).alias("violations"),
        F.sum(F.when(gap.isNotNull(), F.col("interval_us"))).alias("required_us"),
        F.max(late).alias("late_max_us"),
        F.sum(late).alias("late_sum_us"),
        F.count(late).alias("lates"),
        F.max_by("interval_us", start_at).alias("interval_us"),
        F.max_by("interval_source", start_at).alias("interval_source"),
        F.max("pause_from_us").alias("pause_from_us"),
        F.max("event_code").alias("event_code"),
    )


def counted_cells(entries: DataFrame) -> DataFrame:
    """Entries (of ``keyed``, off the timeline) once each per (bucket, id), one cell per
    bucket with the ``_entry_counts`` only: no sort, no window."""
    once = entries.groupBy("bucket", "id").agg(
        F.max("kind").alias("kind"), F.max("now").alias("now")
    )
    return once.groupBy("bucket").agg(*_entry_counts())


def sketch_cells(entries: DataFrame) -> DataFrame:
    """``annotate``-d entries folded per (bucket, hbin) into the sketches of its starts'
    lateness and gaps and the count of its gaps (``binned``): the gap histogram, and one to
    a few sketches per bucket to merge (worker, tbin and pause_to_us null). The histogram
    is a key here, not 41 counts in every cell of the cube, which cost a fifth of its time."""
    is_start = F.col("is_start")
    return entries.groupBy("bucket", "hbin").agg(
        F.kll_sketch_agg_bigint(F.when(is_start, F.col("late")), KLL_K).alias("late_sketch"),
        F.kll_sketch_agg_bigint(F.col("gap_us"), KLL_K).alias("gap_sketch"),
        F.count("gap_us").alias("binned"),
    )


def duplicate_cells(entries: DataFrame, examples: int = 10) -> DataFrame:
    """Per bucket where a (task, retries) was started by more than one delivery (holder):
    ``duplicate_starts`` (the starts after each task's first holder's) and up to ``examples``
    of those ``duplicate_tasks``; an entry (bucket, id) is read once however often repeated."""
    keys = ("bucket", "task", "r")
    # The distinct holders first: only counts in the buffers, so hash-aggregated, no sort.
    holders = (
        entries.where(F.col("is_start") & F.col("holder").isNotNull())
        .select(*keys, "holder")
        .distinct()
        .groupBy(*keys)
        .agg(F.count(F.lit(1)).alias("holders"))
    )
    return (
        holders.where(F.col("holders") > 1)
        .groupBy("bucket")
        .agg(
            F.sum(F.col("holders") - 1).alias("duplicate_starts"),
            F.slice(F.sort_array(F.collect_set("task")), 1, examples).alias("duplicate_tasks"),
        )
    )


def union_cells(cube: DataFrame, *others: DataFrame) -> DataFrame:
    """``cube`` with the cells of ``others`` appended; a column a frame lacks is null there."""
    types = {f.name: f.dataType for f in cube.schema.fields}
    for other in others:
        for f in other.schema.fields:
            types.setdefault(f.name, f.dataType)
    frames = [
        df.select(
            *[
                (F.col(n) if n in df.columns else F.lit(None).cast(t)).alias(n)
                for n, t in types.items()
            ]
        )
        for df in (cube, *others)
    ]
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out


def worker_shares(cube: DataFrame) -> DataFrame:
    """(bucket, workers): each worker's starts and share of its bucket's starts, as an array
    of (worker, starts, share), the busiest first."""
    per = (
        cube.where(F.col("worker").isNotNull())
        .groupBy("bucket", "worker")
        .agg(F.sum("starts").alias("starts"))
    )
    listed = per.groupBy("bucket").agg(
        F.sort_array(F.collect_list(F.struct("starts", "worker")), asc=False).alias("w")
    )
    total = F.aggregate("w", F.lit(0).cast(LongType()), lambda acc, x: acc + x["starts"])
    return listed.select(
        "bucket",
        F.transform(
            "w", lambda x: F.struct(x["worker"], x["starts"], (x["starts"] / total).alias("share"))
        ).alias("workers"),
    )


def _quantile(sketch: Column, q: float, present: Column) -> Column:
    return F.when(present, F.kll_sketch_get_quantile_bigint(sketch, F.lit(q)))


def summary(cube: DataFrame) -> DataFrame:
    """One row per bucket with entries: every figure of the audit (``*_s`` in seconds)."""
    sums = ("entries", "grants", "regrants", "waits", "held", "paused_claims", "retickets",
            "dedupe_drops", "reclaims", "readmits", "starts", "gaps", "unknown_gaps",
            "violations", "required_us", "duplicate_starts")  # fmt: skip
    folded = cube.groupBy("bucket").agg(
        *[F.coalesce(F.sum(n), F.lit(0)).alias(n) for n in sums],
        F.first("duplicate_tasks", ignorenulls=True).alias("duplicate_tasks"),
        F.min("first_entry_us").alias("first_entry_us"),
        F.max("last_entry_us").alias("last_entry_us"),
        F.min("first_start_us").alias("first_start_us"),
        F.max("last_start_us").alias("last_start_us"),
        F.min("min_gap_us").alias("min_gap_us"),
        F.max("late_max_us").alias("late_max_us"),
        F.kll_merge_agg_bigint("late_sketch", KLL_K).alias("late_sketch"),
        F.kll_merge_agg_bigint("gap_sketch", KLL_K).alias("gap_sketch"),
        F.max_by("interval_us", "last_start_us").alias("interval_us"),
        F.max_by("interval_source", "last_start_us").alias("interval_source"),
        F.collect_list(
            F.when(
                F.col("pause_to_us").isNotNull(),
                F.struct(
                    F.col("pause_from_us").alias("start_us"), F.col("pause_to_us").alias("end_us")
                ),
            )
        ).alias("closed"),
        F.max("event_code").alias("event_code"),
    )
    # A pause still open at the end of the ledger: a window without an end.
    still_open = F.when(
        F.col("event_code") % 2 == 1,
        F.array(
            F.struct(
                F.floor(F.col("event_code") / 2).alias("start_us"),
                F.lit(None).cast(LongType()).alias("end_us"),
            )
        ),
    ).otherwise(F.array().cast("array<struct<start_us:bigint,end_us:bigint>>"))
    windows = F.array_sort(F.concat(F.col("closed"), still_open))
    first, last = F.col("first_start_us"), F.col("last_start_us")
    starts_n = F.col("starts")
    overlap = F.aggregate(
        windows,
        F.lit(0).cast(LongType()),
        lambda acc, w: (
            acc
            + F.greatest(
                F.lit(0).cast(LongType()),
                F.least(F.coalesce(w["end_us"], last), last) - F.greatest(w["start_us"], first),
            )
        ),
    )
    paused_us = F.when(starts_n < 2, F.lit(0).cast(LongType())).otherwise(overlap)  # no span
    span_us = last - first
    active_us = span_us - F.coalesce(paused_us, F.lit(0))
    interval_us = F.col("interval_us")
    violations = (
        F.when(starts_n < 2, F.lit(0))
        .when(F.col("unknown_gaps") > 0, F.lit(None))
        .otherwise(F.col("violations"))
    )
    has_gaps, has_starts = F.col("gaps") > 0, starts_n > 0
    joined = folded.join(worker_shares(cube), "bucket", "left")
    return joined.select(
        "bucket",
        "entries",
        starts_n.alias("starts"),
        _seconds(span_us).alias("span_s"),
        _seconds(interval_us).alias("interval_s"),
        F.element_at(F.array(*[F.lit(x) for x in SOURCES]), F.col("interval_source") + 1).alias(
            "interval_source"
        ),
        (F.lit(1e6) / interval_us).alias("configured_rate_per_s"),
        F.when(active_us > 0, (starts_n - 1) * F.lit(1e6) / active_us).alias("rate_per_s"),
        F.when(active_us > 0, F.col("required_us") / active_us).alias("utilization"),
        _seconds(F.col("min_gap_us")).alias("min_gap_s"),
        _seconds(_quantile(F.col("gap_sketch"), 0.01, has_gaps)).alias("p1_gap_s"),
        _seconds(_quantile(F.col("gap_sketch"), 0.5, has_gaps)).alias("p50_gap_s"),
        violations.alias("violations"),
        _seconds(_quantile(F.col("late_sketch"), 0.5, has_starts)).alias("late_p50_s"),
        _seconds(_quantile(F.col("late_sketch"), 0.95, has_starts)).alias("late_p95_s"),
        _seconds(_quantile(F.col("late_sketch"), 0.99, has_starts)).alias("late_p99_s"),
        _seconds(F.col("late_max_us")).alias("late_max_s"),
        "grants",
        "retickets",
        "waits",
        "held",
        "paused_claims",
        "dedupe_drops",
        "regrants",
        "reclaims",
        "readmits",
        "duplicate_starts",
        F.coalesce(F.col("duplicate_tasks"), F.array().cast("array<string>")).alias(
            "duplicate_tasks"
        ),
        F.size(windows).alias("pauses"),
        _seconds(paused_us).alias("paused_s"),
        windows.alias("pause_windows"),
        F.coalesce(
            F.col("workers"),
            F.array().cast("array<struct<worker:string,starts:bigint,share:double>>"),
        ).alias("workers"),
        "first_entry_us",
        "last_entry_us",
        "first_start_us",
        F.coalesce((violations == 0) & (F.col("duplicate_starts") == 0), F.lit(False)).alias("ok"),
    )


def gap_histogram(cube: DataFrame) -> DataFrame:
    """(bucket, bin, lo_s, hi_s, gaps, interval_s): gaps in tenths of the interval each start
    had to clear (shown at the bucket's last interval); the last bin holds 4 intervals and
    more. A bin is wholly below the interval or not."""
    per_bin = (
        cube.where(F.col("hbin").isNotNull())
        .groupBy("bucket", F.col("hbin").alias("bin"))
        .agg(F.sum("binned").alias("gaps"))
    )
    last = cube.groupBy("bucket").agg(F.max_by("interval_us", "last_start_us").alias("iv"))
    bins = last.where(F.col("iv").isNotNull()).select(
        "bucket", "iv", F.explode(F.sequence(F.lit(0), F.lit(HIST_BINS - 1))).alias("bin")
    )
    width = F.col("iv") / HIST_PER_INTERVAL / 1e6
    return bins.join(per_bin, ["bucket", "bin"], "left").select(
        "bucket",
        "bin",
        (F.col("bin") * width).alias("lo_s"),
        ((F.col("bin") + 1) * width).alias("hi_s"),
        F.coalesce(F.col("gaps"), F.lit(0)).cast(LongType()).alias("gaps"),
        _seconds(F.col("iv")).alias("interval_s"),
    )


def lateness_series(cube: DataFrame, points: int = 300) -> DataFrame:
    """(bucket, t_s, late_mean_s, late_max_s, starts): lateness over time in at most
    ``points`` time bins per bucket, ``t_s`` from the bucket's first start."""
    per_second = cube.where(F.col("tbin").isNotNull())
    span = per_second.groupBy("bucket").agg(
        F.max("tbin").alias("last_tbin"), F.min("first_start_us").alias("t0")
    )
    binned = per_second.join(span, "bucket").withColumn(
        "pbin", F.floor(F.col("tbin") * points / (F.col("last_tbin") + 1))
    )
    return binned.groupBy("bucket", "pbin").agg(
        _seconds(F.min("first_start_us") - F.min("t0")).alias("t_s"),
        _seconds(F.sum("late_sum_us") / F.sum("lates")).alias("late_mean_s"),
        _seconds(F.max("late_max_us")).alias("late_max_s"),
        F.sum("starts").alias("starts"),
    )


@dataclass(frozen=True)
class AuditFrames:
    """The audit's DataFrames: the annotated timeline and the cube (``summary`` from it)."""

    entries: DataFrame
    cube: DataFrame

    @property
    def summary(self) -> DataFrame:
        """The summary of the cube (built on each access: ``main`` builds its own over the
        persisted cube)."""
        return summary(self.cube)


def audit(raw: DataFrame, intervals_us: Mapping[str, int] | None = None) -> AuditFrames:
    """Every frame of the audit of ``raw`` ledger entries (any number of buckets and exports):
    the annotated timeline and the cube (with the counted cells of the other entries and the
    duplicate starts' cells)."""
    shuffled = _shared(keyed(raw))
    timeline = annotate(shuffled.where(on_timeline()), intervals_us)
    cube = union_cells(
        cube_of(timeline),
        sketch_cells(timeline),
        counted_cells(shuffled.where(~on_timeline())),
        duplicate_cells(shuffled),
    )
    return AuditFrames(timeline, cube)


def _shared(shuffled: DataFrame) -> DataFrame:
    """``shuffled`` read whole by each of the audit's three halves, so that they share one
    scan and one shuffle (Spark reuses an exchange only where the plans below it are equal).
    Observing a metric of every column keeps the optimizer from pushing a half's filter, or
    its choice of columns, below the shuffle; the metric itself is not used."""
    # A count the optimizer cannot fold away: it cannot know that no entry is at now = -1
    # (a count of a column that cannot be null becomes count(1), and the column is dropped).
    every_column = F.when(F.col("now") == -1, F.struct(*shuffled.columns))
    return shuffled.observe(Observation(), F.count(every_column).alias("never"))


# -- I/O ---------------------------------------------------------------------------------------


#: The JVM options of the audit's own session (``conf`` may replace them).
JVM_OPTIONS = "-XX:+UseParallelGC"


def build_session(master: str = "local[*]", conf: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession for the audit on ``master`` (``local[*]`` or a cluster's URL); ``conf``
    adds or overrides Spark settings (e.g. ``spark.driver.memory``)."""
    builder = (
        SparkSession.builder.master(master)
        .appName("celery-interval audit")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if master.startswith("local"):
        # One machine: a few shuffle partitions per core, not the cluster default of 200.
        builder = builder.config("spark.sql.shuffle.partitions", "16")
    # The percentile sketches are a few per bucket: keep them hashed with many buckets (Spark
    # falls back to sorting every entry above 128 groups per task).
    builder = builder.config("spark.sql.objectHashAggregate.sortBased.fallbackThreshold", "1000000")
    # Building the plan is thousands of calls into the JVM; recording the Python call site of
    # each expression for error messages made 13,400 of them, not 5,400 (4.0 s, not 3.3 s).
    builder = builder.config("spark.python.sql.dataFrameDebugging.enabled", "false")
    # One plan, made once: re-planning at each stage saved nothing here and cost about 3 s
    # of 50 (the shuffle's 16 partitions are already few; bench/audit.py).
    builder = builder.config("spark.sql.adaptive.enabled", "false")
    # A batch job: the throughput collector, not G1, whose background threads and write
    # barriers took a fifth of the main stage's task time on two cores (bench/audit.py).
    for side in ("driver", "executor"):
        builder = builder.config(f"spark.{side}.extraJavaOptions", JVM_OPTIONS)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _is_parquet(path: str) -> bool:
    if path.rstrip("/").endswith(".parquet"):
        return True
    folder = Path(path)
    return "://" not in path and folder.is_dir() and any(folder.glob("*.parquet"))


def read_ledgers(spark: SparkSession, paths: Sequence[str]) -> DataFrame:
    """Exported ledgers: JSON lines files or directories of them, or Parquet (``*.parquet``,
    or a directory of Parquet files)."""
    parquet = [str(p) for p in paths if _is_parquet(str(p))]
    json_paths = [str(p) for p in paths if str(p) not in parquet]
    frames: list[DataFrame] = []
    if json_paths:
        frames.append(spark.read.schema(LEDGER_SCHEMA).option("mode", "FAILFAST").json(json_paths))
    if parquet:
        frames.append(typed_columns(spark.read.parquet(*parquet), LEDGER_SCHEMA.fieldNames()))
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other)
    return df


def _plot_choice(rows: Sequence[Mapping[str, Any]], limit: int) -> list[str]:
    ranked = sorted(rows, key=lambda r: (bool(r["ok"]), -int(r["starts"]), r["bucket"]))
    return [r["bucket"] for r in ranked if r["starts"] > 1][:limit]


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    pq.write_table(pa.Table.from_pylist(rows), path)


def main(
    ledgers: Sequence[str],
    out_dir: str | Path,
    *,
    master: str = "local[*]",
    intervals_us: Mapping[str, int] | None = None,
    plot_buckets: int = 20,
    conf: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Audit ``ledgers`` and write DIR/summary.json, summary.parquet, the PNG plots and
    report.html; returns the summary document. Reuses an active SparkSession (and then
    leaves it running), else starts one on ``master`` and stops it at the end."""
    from celery_interval.spark import page, plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spark = SparkSession.getActiveSession()
    own = spark is None
    if spark is None:
        spark = build_session(master, conf)
    cube: DataFrame | None = None
    try:
        # The one pass over the entries; the cube it leaves is small and kept for the rest.
        frames = audit(read_ledgers(spark, ledgers), intervals_us)
        cube = frames.cube.persist(StorageLevel.MEMORY_AND_DISK)
        rows = [r.asDict(recursive=True) for r in summary(cube).orderBy("bucket").collect()]
        doc: dict[str, Any] = {
            "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "ledgers": [str(p) for p in ledgers],
            "intervals_of": {b: us / 1e6 for b, us in sorted((intervals_us or {}).items())},
            "entries": sum(int(r["entries"]) for r in rows),
            "ok": all(r["ok"] for r in rows),
            "buckets": rows,
        }
        (out / "summary.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        _write_parquet(rows, out / "summary.parquet")
        chosen = _plot_choice(rows, plot_buckets)
        images = _plots(cube.where(F.col("bucket").isin(chosen)), rows, chosen, out, plots)
        page.write_report(out / "report.html", doc, images)
        return doc
    finally:
        if cube is not None:
            cube.unpersist()
        if own:
            spark.stop()


def _plots(
    cube: DataFrame, rows: Sequence[Mapping[str, Any]], chosen: list[str], out: Path, plots: Any
) -> dict[str, list[str]]:
    """Draw the chosen buckets' plots; returns bucket -> PNG file names ("" -> shared ones)."""
    by_bucket = {r["bucket"]: r for r in rows}
    hist: dict[str, list[tuple[float, float, int]]] = {}
    for r in gap_histogram(cube).orderBy("bucket", "bin").collect():
        hist.setdefault(r["bucket"], []).append((r["lo_s"], r["hi_s"], r["gaps"]))
    series: dict[str, list[tuple[float, float, float]]] = {}
    for r in lateness_series(cube).orderBy("bucket", "t_s").collect():
        series.setdefault(r["bucket"], []).append((r["t_s"], r["late_mean_s"], r["late_max_s"]))
    images: dict[str, list[str]] = {}
    for n, bucket in enumerate(chosen):
        row = by_bucket[bucket]
        t0 = row["first_start_us"]
        pauses = [
            ((w["start_us"] - t0) / 1e6, ((w["end_us"] or row["last_entry_us"]) - t0) / 1e6)
            for w in row["pause_windows"]
        ]
        gaps_png, late_png = f"bucket-{n:03d}-gaps.png", f"bucket-{n:03d}-lateness.png"
        plots.gap_histogram(out / gaps_png, bucket, hist.get(bucket, []), row["interval_s"])
        plots.lateness(out / late_png, bucket, series.get(bucket, []), pauses)
        images[bucket] = [gaps_png, late_png]
    if chosen:
        plots.worker_share(
            out / "workers.png",
            [(b, [(w["worker"], w["share"]) for w in by_bucket[b]["workers"]]) for b in chosen],
        )
        images[""] = ["workers.png"]
    return images
