"""The audit's checks over the cube: per-bucket gaps, violations, utilization, lateness, workers."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from celery_interval.spark.cube import KLL_K
from celery_interval.spark.entries import HIST_BINS, HIST_PER_INTERVAL, SOURCES

__all__ = ["gap_histogram", "lateness_series", "summary", "worker_shares"]


def _seconds(us: Column) -> Column:
    """``us`` (microseconds) in seconds."""
    return us.cast("double") / 1e6


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
    total = F.aggregate("w", _long_zero(), lambda acc, x: acc + x["starts"])
    return listed.select(
        "bucket",
        F.transform(
            "w", lambda x: F.struct(x["worker"], x["starts"], (x["starts"] / total).alias("share"))
        ).alias("workers"),
    )


def _quantile(sketch: Column, q: float, present: Column) -> Column:
    """The ``q`` quantile of the KLL sketch ``sketch``, null where ``present`` is false."""
    return F.when(present, F.kll_sketch_get_quantile_bigint(sketch, F.lit(q)))


#: The cube's counts summed per bucket (0 where a bucket has none).
_SUMS = ("entries", "grants", "regrants", "waits", "held", "paused_claims", "retickets",
         "dedupe_drops", "reclaims", "readmits", "starts", "gaps", "unknown_gaps",
         "violations", "required_us", "duplicate_starts", "limit_violations")  # fmt: skip

#: The per-bucket counts ``summary`` shows as they are, in its column order.
_COUNTS = ("grants", "retickets", "waits", "held", "paused_claims", "dedupe_drops", "regrants",
           "reclaims", "readmits", "duplicate_starts")  # fmt: skip


def summary(cube: DataFrame) -> DataFrame:
    """One row per bucket with entries: every figure of the audit (``*_s`` in seconds)."""
    windows = _pause_windows()
    paused_us = _paused_us(windows)
    violations = _violations()
    joined = _fold(cube).join(worker_shares(cube), "bucket", "left")
    return joined.select(
        "bucket",
        "entries",
        *_rate_columns(paused_us),
        *_gap_columns(),
        violations.alias("violations"),
        *_lateness_columns(),
        *_COUNTS,
        _or_empty(F.col("duplicate_tasks"), "array<string>").alias("duplicate_tasks"),
        F.size(windows).alias("pauses"),
        _seconds(paused_us).alias("paused_s"),
        windows.alias("pause_windows"),
        _or_empty(
            F.col("workers"), "array<struct<worker:string,starts:bigint,share:double>>"
        ).alias("workers"),
        "first_entry_us",
        "last_entry_us",
        "first_start_us",
        _limits(F.col("limit_cells")).alias("limits"),
        "limit_violations",
        _ok(violations).alias("ok"),
    )


def _fold(cube: DataFrame) -> DataFrame:
    """The cube folded to one row per bucket: its sums, first and last times, merged sketches,
    last interval, closed pause windows, pause state (``event_code``) and limit cells."""
    return cube.groupBy("bucket").agg(
        *[F.coalesce(F.sum(n), F.lit(0)).alias(n) for n in _SUMS],
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
        _closed_pauses().alias("closed"),
        F.max("event_code").alias("event_code"),
        _limit_cell_list().alias("limit_cells"),
    )


def _closed_pauses() -> Column:
    """Aggregate: the bucket's closed pause windows, each as (start_us, end_us)."""
    return F.collect_list(
        F.when(
            F.col("pause_to_us").isNotNull(),
            F.struct(
                F.col("pause_from_us").alias("start_us"), F.col("pause_to_us").alias("end_us")
            ),
        )
    )


def _limit_cell_list() -> Column:
    """Aggregate: the bucket's extra limits' cells, sorted (the shortest interval first), each as
    (interval_us, burst, limit, starts, violations)."""
    return F.sort_array(
        F.collect_list(
            F.when(
                F.col("limit").isNotNull(),
                F.struct(
                    F.col("limit_interval_us").alias("interval_us"),
                    F.col("limit_burst").alias("burst"),
                    F.col("limit"),
                    F.col("limit_starts").alias("starts"),
                    F.col("limit_violations").alias("violations"),
                ),
            )
        )
    )


def _long_zero() -> Column:
    """A bigint 0."""
    return F.lit(0).cast(LongType())


def _or_empty(column: Column, array_type: str) -> Column:
    """``column``, or an empty array of ``array_type`` where it is null."""
    return F.coalesce(column, F.array().cast(array_type))


def _pause_windows() -> Column:
    """The folded bucket's pause windows, sorted: the closed ones, and one still open at the
    end of the ledger (odd ``event_code``) as a window without an end."""
    still_open = F.when(
        F.col("event_code") % 2 == 1,
        F.array(
            F.struct(
                F.floor(F.col("event_code") / 2).alias("start_us"),
                F.lit(None).cast(LongType()).alias("end_us"),
            )
        ),
    ).otherwise(F.array().cast("array<struct<start_us:bigint,end_us:bigint>>"))
    return F.array_sort(F.concat(F.col("closed"), still_open))


def _paused_us(windows: Column) -> Column:
    """How long ``windows`` overlap the span from the first start to the last, in
    microseconds (0 with fewer than 2 starts: no span)."""
    first, last = F.col("first_start_us"), F.col("last_start_us")
    overlap = F.aggregate(
        windows,
        _long_zero(),
        lambda acc, w: (
            acc
            + F.greatest(
                _long_zero(),
                F.least(F.coalesce(w["end_us"], last), last) - F.greatest(w["start_us"], first),
            )
        ),
    )
    return F.when(F.col("starts") < 2, _long_zero()).otherwise(overlap)


def _span_us() -> Column:
    """From the first start to the last, in microseconds."""
    return F.col("last_start_us") - F.col("first_start_us")


def _violations() -> Column:
    """Starts that broke the interval: 0 with fewer than 2 starts, null (unknown) where a gap
    before a start is unknown."""
    return (
        F.when(F.col("starts") < 2, F.lit(0))
        .when(F.col("unknown_gaps") > 0, F.lit(None))
        .otherwise(F.col("violations"))
    )


def _rate_columns(paused_us: Column) -> list[Column]:
    """starts, span_s, interval_s, interval_source, configured_rate_per_s, and over the span
    less its pauses: rate_per_s and utilization."""
    starts_n, interval_us = F.col("starts"), F.col("interval_us")
    active_us = _span_us() - F.coalesce(paused_us, F.lit(0))
    return [
        starts_n.alias("starts"),
        _seconds(_span_us()).alias("span_s"),
        _seconds(interval_us).alias("interval_s"),
        F.element_at(F.array(*[F.lit(x) for x in SOURCES]), F.col("interval_source") + 1).alias(
            "interval_source"
        ),
        (F.lit(1e6) / interval_us).alias("configured_rate_per_s"),
        F.when(active_us > 0, (starts_n - 1) * F.lit(1e6) / active_us).alias("rate_per_s"),
        F.when(active_us > 0, F.col("required_us") / active_us).alias("utilization"),
    ]


def _gap_columns() -> list[Column]:
    """min_gap_s, p1_gap_s, p50_gap_s: the smallest gap between starts and the gaps' 1st
    and 50th percentiles."""
    has_gaps = F.col("gaps") > 0
    return [
        _seconds(F.col("min_gap_us")).alias("min_gap_s"),
        *_quantiles_s("gap_sketch", has_gaps, {"p1_gap_s": 0.01, "p50_gap_s": 0.5}),
    ]


def _lateness_columns() -> list[Column]:
    """late_p50_s, late_p95_s, late_p99_s, late_max_s: the starts' lateness percentiles
    and most."""
    quantiles = {"late_p50_s": 0.5, "late_p95_s": 0.95, "late_p99_s": 0.99}
    return [
        *_quantiles_s("late_sketch", F.col("starts") > 0, quantiles),
        _seconds(F.col("late_max_us")).alias("late_max_s"),
    ]


def _quantiles_s(sketch: str, present: Column, quantiles: dict[str, float]) -> list[Column]:
    """The quantiles of the KLL sketch column ``sketch`` in seconds, each named by its key
    in ``quantiles``; null where ``present`` is false."""
    return [_seconds(_quantile(F.col(sketch), q, present)).alias(n) for n, q in quantiles.items()]


def _ok(violations: Column) -> Column:
    """True where no start broke the interval (known: ``violations`` is 0), none started
    twice and none broke an extra limit."""
    return F.coalesce(
        (violations == 0) & (F.col("duplicate_starts") == 0) & (F.col("limit_violations") == 0),
        F.lit(False),
    )


def _limits(cells: Column) -> Column:
    """The extra limits' cells, the shortest interval first, each as (limit, interval_s, burst,
    starts, violations): ``limit`` is its name (``'100/min'``, ``'1000/h burst 50'``)."""
    return F.transform(
        cells,
        lambda c: F.struct(
            c["limit"].alias("limit"),
            _seconds(c["interval_us"]).alias("interval_s"),
            c["burst"].alias("burst"),
            c["starts"].alias("starts"),
            c["violations"].alias("violations"),
        ),
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
