"""The audit's cube: annotated entries folded into small per-bucket cells of counts and sketches."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from celery_interval.spark.entries import KINDS, flag, ledger_order
from celery_interval.starts import THROTTLE_OP

__all__ = [
    "KLL_K",
    "counted_cells",
    "cube_of",
    "duplicate_cells",
    "sketch_cells",
    "union_cells",
]

#: The KLL sketch size of a bucket's percentiles: exact (nearest rank) up to about k values,
#: then a rank error of about 0.01 %.
KLL_K = 20_000


def _count_if(condition: Column) -> Column:
    return F.sum(F.when(condition, 1).otherwise(0))


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
        _count_if(is_start & flag("readmit")).alias("readmits"),
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
    is a key here, not ``HIST_BINS`` counts in every cell of the cube, each evaluated for every
    start."""
    is_start = F.col("is_start")
    return entries.groupBy("bucket", "hbin").agg(
        F.kll_sketch_agg_bigint(F.when(is_start, F.col("late")), KLL_K).alias("late_sketch"),
        F.kll_sketch_agg_bigint(F.col("gap_us"), KLL_K).alias("gap_sketch"),
        F.count("gap_us").alias("binned"),
    )


def duplicate_cells(entries: DataFrame, examples: int = 10) -> DataFrame:
    """Per bucket where a (task, retries) was started by more deliveries (holders) than its one
    run and one more per throttle (``Throttled``: it runs again, by design):
    ``duplicate_starts`` (the starts beyond those) and up to ``examples`` of those
    ``duplicate_tasks``. A holder counts when it was admitted a start and its last OK (a
    start, or a re-claim ``is_again``) came after its last claim answered otherwise under its
    lease (``is_missed``: that start had not happened), in the order of the bucket's stream
    (``ledger_order``: the store's clock may tie or step back); an entry (bucket, id) is read
    once however often repeated."""
    keys = ("bucket", "task", "r")
    is_start, is_again, is_missed = F.col("is_start"), F.col("is_again"), F.col("is_missed")
    is_throttle = F.col("op") == THROTTLE_OP
    order = ledger_order()
    # Per holder (a throttle: per entry) and then per copy: only counts and maxima in the
    # buffers, so hash-aggregated, no sort.
    per_who = (
        entries.where(
            ((is_start | is_again | is_missed) & F.col("holder").isNotNull()) | is_throttle
        )
        .groupBy(*keys, F.when(is_throttle, F.col("id")).otherwise(F.col("holder")).alias("who"))
        .agg(
            F.max(is_throttle.cast("int")).alias("throttle"),
            F.max(is_start.cast("int")).alias("admitted"),
            F.max(F.when(is_start | is_again, order)).alias("last_ok"),
            F.max(F.when(is_missed, order)).alias("missed"),
        )
    )
    ran = (F.col("admitted") == 1) & (
        F.col("missed").isNull() | (F.col("last_ok") > F.col("missed"))
    )
    per_task = per_who.groupBy(*keys).agg(
        F.count(F.when((F.col("throttle") == 0) & ran, True)).alias("holders"),
        F.count(F.when(F.col("throttle") == 1, True)).alias("throttles"),
    )
    extra = F.col("holders") - 1 - F.col("throttles")
    return (
        per_task.where(extra > 0)
        .groupBy("bucket")
        .agg(
            F.sum(extra).alias("duplicate_starts"),
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
