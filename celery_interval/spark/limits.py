"""The audit of the extra limits: each start judged by the budget of every limit its claim names."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from celery_interval.config.intervals import RATE_UNITS_US, US_PER_S
from celery_interval.spark.entries import is_repeat, with_overdrawn

__all__ = ["limit_cells", "limit_checks", "limit_name", "rate_text"]


def rate_text(interval_us: Column) -> Column:
    """``celery_interval.config.intervals.describe_rate`` as a Column (the same arithmetic: a start
    gives ``'100/min'`` for 600000 µs on every surface)."""
    t_us = interval_us.cast(LongType())
    text = F.concat(
        F.regexp_replace(F.format_string("%.6f", t_us / F.lit(float(US_PER_S))), r"\.?0+$", ""),
        F.lit("s"),
    )
    for unit, unit_us in reversed(RATE_UNITS_US):
        count = F.floor(F.lit(float(unit_us)) / t_us + 0.5).cast(LongType())
        whole = (count >= 1) & (F.abs(2 * (F.lit(unit_us) - count * t_us)) <= count)
        text = F.when(whole, F.concat(count.cast("string"), F.lit(f"/{unit}"))).otherwise(text)
    return text


def limit_name(interval_us: Column, burst: Column) -> Column:
    """``celery_interval.config.values.describe_limit`` as a Column: ``'1000/h burst 50'``."""
    suffix = F.when(burst > 1, F.concat(F.lit(" burst "), burst.cast("string"))).otherwise("")
    return F.concat(rate_text(interval_us), suffix)


def limit_checks(entries: DataFrame) -> DataFrame:
    """Each start of ``entries`` (of ``keyed``: shuffled by bucket, repeats still there) once
    per extra limit its claim names (``limits``: ``<interval_us>:<burst>``, comma-separated;
    an unreadable one is skipped, as ``starts.limits_of`` does): bucket, id, task, start_us,
    cost, limit (its name), limit_interval_us, limit_burst, and ``violation``: whether it
    ends a run of that limit's starts with Σ cost > burst + span / interval (``with_overdrawn``
    over the starts of (bucket, limit), in one sort: the frame is already shuffled by bucket)."""
    starts = entries.where(F.col("is_start") & F.col("limits").isNotNull())
    pairs = starts.select(
        "bucket", "id", "task", "start_key", "cost",
        F.explode(F.split(F.col("limits"), ",")).alias("limit_key"),
    )  # fmt: skip
    part = F.split(F.col("limit_key"), ":")
    typed = pairs.select(
        "*",
        part[0].cast(LongType()).alias("limit_interval_us"),
        F.greatest(F.coalesce(part[1].cast(LongType()), F.lit(0)), F.lit(1)).alias("limit_burst"),
    ).where(F.col("limit_interval_us") >= 1)
    order = Window.partitionBy("bucket", "limit_key").orderBy("start_key", "id")
    once = typed.select("*", is_repeat(order).alias("_repeat")).where(~F.col("_repeat"))
    checked = with_overdrawn(
        once.drop("_repeat"),
        order,
        F.lit(True),
        F.col("limit_interval_us"),
        F.col("limit_burst"),
        "violation",
    )
    return checked.select(
        "bucket",
        "id",
        "task",
        F.col("start_key").alias("start_us"),
        F.coalesce(F.col("cost"), F.lit(1)).alias("cost"),
        limit_name(F.col("limit_interval_us"), F.col("limit_burst")).alias("limit"),
        "limit_interval_us",
        "limit_burst",
        "violation",
    )


def limit_cells(checks: DataFrame) -> DataFrame:
    """``limit_checks`` folded into one cell of the cube per (bucket, limit): its starts and
    violations, interval and burst."""
    return checks.groupBy("bucket", "limit").agg(
        F.count(F.lit(1)).alias("limit_starts"),
        F.sum(F.when(F.col("violation"), 1).otherwise(0)).alias("limit_violations"),
        F.max("limit_interval_us").alias("limit_interval_us"),
        F.max("limit_burst").alias("limit_burst"),
    )
