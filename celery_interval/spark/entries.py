"""The ledger's entries for the audit: typed, keyed by bucket, deduplicated, annotated per start."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from celery_interval.starts import (
    AGAIN,
    CONTROL_OPS,
    GRANT_OP,
    MISSED,
    MOVED,
    START_OP,
    THROTTLE_OP,
)

__all__ = [
    "AUDIT_FIELDS",
    "HIST_BINS",
    "HIST_PER_INTERVAL",
    "KINDS",
    "LEDGER_SCHEMA",
    "SOURCES",
    "TBIN_US",
    "annotate",
    "dedupe",
    "flag",
    "is_repeat",
    "keyed",
    "kind_of",
    "ledger_order",
    "normalize",
    "on_timeline",
    "starts_of",
    "typed_columns",
    "with_overdrawn",
    "worker_of",
]

_TEXT = ("bucket", "id", "op", "task", "holder", "limits")
_NUMBERS = ("now", "r", "ticket", "slot", "delay", "epoch", "paused", "start", "late", "again")
_NUMBERS_TOO = ("changed", "interval", "readmit", "burst", "cost", "moved", "missed")
#: Every field an exported entry may carry (``ledger.entry_record``), typed.
LEDGER_SCHEMA = StructType(
    [StructField(n, StringType()) for n in _TEXT]
    + [StructField(n, LongType()) for n in (*_NUMBERS, *_NUMBERS_TOO)]
)
#: The fields the audit reads.
AUDIT_FIELDS = (
    "bucket", "id", "op", "now", "task", "r", "holder", "start", "late", "again",
    "changed", "interval", "readmit", "burst", "cost", "limits", "moved", "missed",
)  # fmt: skip
#: Lateness over time is kept per second of store time, per bucket and worker.
TBIN_US = 1_000_000
#: The gap histogram: bins of a tenth of the interval, the last one for 4 intervals and more.
HIST_PER_INTERVAL = 10
HIST_BINS = 4 * HIST_PER_INTERVAL + 1
_CONTROLS = CONTROL_OPS
#: Besides starts, the entries the running windows read: intervals set, pauses opened, closed.
_TIMELINE_OPS = (*_CONTROLS, "reset")
#: The fields only a start's later steps read.
_START_FIELDS = ("task", "r", "holder", "late", "readmit", "burst", "cost", "limits", "moved")
#: Where a start's interval came from; entries carry the index (numbers aggregate faster).
SOURCES = ("--interval-of", "ledger", "control")


def flag(name: str) -> Column:
    """Whether the 0/1 field ``name`` is set (absent: not set)."""
    return F.coalesce(F.col(name), F.lit(0)) == 1


def ledger_order() -> Column:
    """An entry's place in its bucket's ledger, as (ms, seq) of its stream id (XADD's, which
    only grows, unlike the store clock's ``now``); an entry without such an id (a hand-made
    ledger) is placed by ``now`` (ms, 0)."""
    parts = F.split(F.col("id"), "-")
    stream_id = F.col("id").rlike(r"^[0-9]+-[0-9]+$")
    return F.when(
        stream_id, F.struct(parts[0].cast("long").alias("ms"), parts[1].cast("long").alias("seq"))
    ).otherwise(
        F.struct((F.col("now") / 1000).cast("long").alias("ms"), F.lit(0).cast("long").alias("seq"))
    )


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
    dropped. A *start* is a ``claim:OK`` entry (a holder's re-claim of its own lease,
    ``again=1``, is not: ``is_again``); ``is_missed`` marks a claim of the holder's own lease
    answered other than OK (``missed=1``). Only what a later step reads crosses the shuffle:
    ``op`` of the timeline's entries, the start fields of starts, the copy (task, r, holder)
    of a re-claim and of a missed claim. Overlapping exports' repeats of an entry (bucket, id)
    are still there."""
    valid = F.col("bucket").isNotNull() & F.col("op").isNotNull() & F.col("now").isNotNull()
    # An entry without an id (a hand-made ledger) is never taken for another one.
    unique_id = F.concat(F.lit("row-"), F.monotonically_increasing_id().cast("string"))
    # celery_interval.starts.is_start, as a Column
    is_start = (F.col("op") == START_OP) & ~flag(AGAIN)
    is_again = (F.col("op") == START_OP) & flag(AGAIN)
    is_control = F.col("op").isin(*_TIMELINE_OPS)
    is_throttle = F.col("op") == THROTTLE_OP  # its task runs again: ``cube.duplicate_cells``
    is_missed = F.col("op").startswith("claim:") & flag(MISSED)  # ``cube.duplicate_cells`` too
    return (
        typed_columns(raw, AUDIT_FIELDS)
        .where(valid)
        .select(
            "bucket",
            "now",
            F.coalesce(F.col("id"), unique_id).alias("id"),
            F.when(is_start | is_control | is_throttle, F.col("op")).alias("op"),
            *[
                F.when(
                    is_start
                    | (is_throttle & F.lit(n in ("task", "r")))
                    | ((is_missed | is_again) & F.lit(n in ("task", "r", "holder"))),
                    F.col(n),
                ).alias(n)
                for n in _START_FIELDS
            ],
            F.when(is_start | is_control, F.col("interval")).alias("interval"),
            F.when(is_control, F.col("changed")).alias("changed"),
            is_start.alias("is_start"),
            is_missed.alias("is_missed"),
            is_again.alias("is_again"),
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


def is_repeat(order: WindowSpec | None = None) -> Column:
    """Whether an entry repeats the one before it in time (``order``: a bucket's, by
    (start_key, id)): both copies of an entry (bucket, id) that overlapping exports hold share
    (start_key, id), so they are adjacent."""
    by = _by_time() if order is None else order
    return F.coalesce(F.lag("id").over(by) == F.col("id"), F.lit(False))


def dedupe(entries: DataFrame) -> DataFrame:
    """``entries`` (of ``keyed``) without the repeats of an entry (bucket, id) that
    overlapping exports both hold."""
    return entries.withColumn("repeat", is_repeat()).where(~F.col("repeat")).drop("repeat")


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
    null for a bucket's first start or an unknown interval; for a start of a bucket with a
    burst, ``budget_violation``), worker, tbin (second since the
    bucket's first start) and hbin (histogram bin); for the close of a pause: pause_from_us and
    pause_to_us; for a pause or a close: event_code (now x 2, + 1 for a pause).

    Gaps are measured between the starts the claims admitted (``start``, store real µs), not
    between the claims (``now``): a claim may come up to ``lead`` before the start it admits,
    and the interval governs starts. The interval a gap must clear is the later start's: from
    ``intervals_us`` (``--interval-of``) when given, else the ``interval`` the claim entry
    records, else the one the latest control entry (pause, unpause, set_interval,
    unset_interval) recorded before it. A start its holder missed, which the next start (a
    moved readmit) replaced, is left out of the gaps and budgets."""
    running = _with_running_values(ledger)
    return _budget_checked(_shaped(running, ledger.columns, _interval_override_us(intervals_us)))


def _pause_opened() -> Column:
    """Whether an entry opened a pause: a ``pause`` that changed something."""
    return (F.col("op") == "pause") & flag("changed")


def _pause_closed() -> Column:
    """Whether an entry closed a pause: an ``unpause`` that changed something, or a reset."""
    op = F.col("op")
    return ((op == "unpause") & flag("changed")) | (op == "reset")


def _missed_start() -> Column:
    """Whether an entry is a start its holder missed that its next start moved
    (celery_interval.starts.replaces): no start for the gaps and budgets, that one is at its
    time instead."""
    is_start = F.col("is_start")
    # A holder's starts come one after another in time; the next is the first one later (a
    # repeat shares its time).
    copy = Window.partitionBy("bucket", "task", "r", "holder").orderBy("start_key")
    following = F.first(F.when(is_start, flag(MOVED)), ignorenulls=True).over(
        copy.rangeBetween(1, Window.unboundedFollowing)
    )
    return is_start & F.coalesce(following, F.lit(False))


def _with_running_values(ledger: DataFrame) -> DataFrame:
    """``ledger`` with ``_repeat`` (``is_repeat``), ``_counted`` (a start for the gaps and
    budgets) and its bucket's running values: c_iv (the latest control's interval),
    prev_start_us and prev_task (of the counted start before), t0 (the first start) and
    last_event (the latest pause or close before: open, now)."""
    w = _by_time()
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    upto = w.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    start, is_start = F.col("start_key"), F.col("is_start")
    is_open, is_close = _pause_opened(), _pause_closed()
    control = F.col("op").isin(*_CONTROLS) & F.col("interval").isNotNull()
    # A repeat (the copy of the row before it, see ``dedupe``) leaves every running value of
    # the rows after it as it was, so it is dropped after the passes.
    marked = ledger.select("*", is_repeat().alias("_repeat"))
    counted = F.col("_counted")
    return marked.select("*", (is_start & ~_missed_start()).alias("_counted")).select(
        "*",
        F.last(F.when(control, F.col("interval")), ignorenulls=True).over(upto).alias("c_iv"),
        F.last(F.when(counted, start), ignorenulls=True).over(before).alias("prev_start_us"),
        F.last(F.when(counted, F.col("task")), ignorenulls=True).over(before).alias("prev_task"),
        F.first(F.when(is_start, start), ignorenulls=True).over(upto).alias("t0"),
        F.last(F.when(is_open | is_close, F.struct(is_open.alias("open"), F.col("now"))), True)
        .over(before)
        .alias("last_event"),
    )


def _interval_override_us(intervals_us: Mapping[str, int] | None) -> Column:
    """A bucket's interval from ``intervals_us`` (``--interval-of``; null: none given)."""
    if not intervals_us:
        return F.lit(None).cast(LongType())
    pairs = [F.lit(x) for bucket, us in sorted(intervals_us.items()) for x in (bucket, us)]
    return F.create_map(*pairs)[F.col("bucket")].cast(LongType())


def _shaped(running: DataFrame, columns: Sequence[str], override_us: Column) -> DataFrame:
    """The rows of ``_with_running_values`` but the repeats: ``columns``, ``_counted`` and the
    annotations of ``annotate`` (each start judged by its gap; ``_budget_checked`` next)."""
    start, is_start = F.col("start_key"), F.col("is_start")
    interval_us = F.when(is_start, F.coalesce(override_us, F.col("interval"), F.col("c_iv")))
    gap_us = F.when(is_start, start - F.col("prev_start_us"))
    return running.where(~F.col("_repeat")).select(
        *columns,
        "_counted",
        F.when(is_start, F.col("prev_start_us")).alias("prev_start_us"),
        F.when(is_start, F.col("prev_task")).alias("prev_task"),
        interval_us.alias("interval_us"),
        _interval_source(override_us).alias("interval_source"),
        gap_us.alias("gap_us"),
        (gap_us < interval_us).alias("violation"),  # celery_interval.starts.is_violation
        F.when(is_start, worker_of(F.col("holder"))).alias("worker"),
        F.when(is_start, F.floor((start - F.col("t0")) / TBIN_US)).alias("tbin"),
        _histogram_bin(gap_us, interval_us).cast("int").alias("hbin"),
        *_pause_columns(),
    )


def _interval_source(override_us: Column) -> Column:
    """For a start, the index in ``SOURCES`` of where its interval came from."""
    is_start = F.col("is_start")
    return (
        F.when(is_start & override_us.isNotNull(), SOURCES.index("--interval-of"))
        .when(is_start & F.col("interval").isNotNull(), SOURCES.index("ledger"))
        .when(is_start & F.col("c_iv").isNotNull(), SOURCES.index("control"))
    )


def _histogram_bin(gap_us: Column, interval_us: Column) -> Column:
    """The gap histogram's bin of a gap (a tenth of the interval each, the last one open)."""
    return F.when(  # (least() skips nulls: a first start would land in the last bin)
        gap_us.isNotNull() & interval_us.isNotNull(),
        F.least(F.floor(gap_us * HIST_PER_INTERVAL / interval_us), F.lit(HIST_BINS - 1)),
    )


def _pause_columns() -> list[Column]:
    """pause_from_us and pause_to_us of a pause's close, event_code of a pause or a close."""
    is_open, is_close = _pause_opened(), _pause_closed()
    last_event = F.col("last_event")
    return [
        F.when(is_close & last_event["open"], last_event["now"]).alias("pause_from_us"),
        F.when(is_close & last_event["open"], F.col("now")).alias("pause_to_us"),
        # the last pause or close wins: now x 2 + 1 for a pause (max() of it is the latest)
        F.when(is_open | is_close, F.col("now") * 2 + is_open.cast("long")).alias("event_code"),
    ]


def _budget_checked(shaped: DataFrame) -> DataFrame:
    """``shaped`` with each start of a bucket with a burst (its claim records ``burst``)
    judged by the budget instead of the gap before it (``with_overdrawn`` over the bucket's
    starts, at each start's own interval: exact while a bucket's interval stays the same; the
    gap rule is its case burst = cost = 1). A second window pass over the same sort (no
    shuffle, no sort)."""
    counted = F.col("_counted")
    checked = with_overdrawn(
        shaped, _by_time(), counted, F.col("interval_us"), F.col("burst"), "_overdrawn"
    )
    budget = F.col("is_start") & F.col("burst").isNotNull()
    return checked.select(
        *[F.when(budget, F.col("_overdrawn")).otherwise(F.col(c)).alias(c)
          if c == "violation" else c for c in shaped.columns if c != "_counted"]
    )  # fmt: skip


def with_overdrawn(
    df: DataFrame, order: WindowSpec, counted: Column, interval_us: Column, burst: Column, into: str
) -> DataFrame:
    """``df`` with ``into``: for each ``counted`` row (a start; null on the others), whether
    it ends a run of counted rows i..j in ``order`` with Σ cost > burst + span / interval
    (``celery_interval.starts.Budget``'s property, for a budget of ``burst`` units refilled
    one per ``interval_us``; span: from s_i to s_j, ``start_key``). With prefix sums of cost
    P, the worst run ending at j starts where (P_i-1 · T - s_i) is least: a running minimum,
    in one more window pass over ``order``."""
    start = F.col("start_key")
    cost = F.coalesce(F.col("cost"), F.lit(1))
    upto = order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    spent = df.select("*", F.sum(F.when(counted, cost).otherwise(0)).over(upto).alias("_spent"))
    run_from = F.when(counted, (F.col("_spent") - cost) * interval_us - start)
    least = F.min(run_from).over(upto)
    overdrawn = F.col("_spent") * interval_us - start - least > burst * interval_us
    return spent.select(*df.columns, F.when(counted, overdrawn).alias(into))


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
    op, again = F.col("op"), flag(AGAIN)
    kinds = {
        "grants": (op == GRANT_OP) & ~again,
        "regrants": (op == GRANT_OP) & again,
        "waits": op.isin("claim:WAIT", "claim:FULL"),
        "held": op.isin("grant:HELD", "claim:HELD"),
        "paused_claims": op == "claim:PAUSED",
        "retickets": op == "claim:RETICKET",
        "dedupe_drops": op.isin("grant:DUPLICATE", "claim:DUPLICATE"),
        "reclaims": (op == START_OP) & again,
    }
    chosen = F.lit(None).cast("int")
    for n, name in reversed(list(enumerate(KINDS))):
        chosen = F.when(kinds[name], F.lit(n)).otherwise(chosen)
    return chosen
