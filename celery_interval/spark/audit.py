"""The ledger audit job: read the exports, run the checks, write summary, plots and report."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from celery_interval.spark.checks import gap_histogram, lateness_series, summary
from celery_interval.spark.cube import (
    counted_cells,
    cube_of,
    duplicate_cells,
    sketch_cells,
    union_cells,
)
from celery_interval.spark.entries import LEDGER_SCHEMA, annotate, keyed, on_timeline, typed_columns
from celery_interval.spark.limits import limit_cells, limit_checks

__all__ = ["AuditFrames", "audit", "build_session", "main", "read_ledgers"]


@dataclass(frozen=True)
class AuditFrames:
    """The audit's DataFrames: the annotated timeline, each start per extra limit it was
    counted against (``limits.limit_checks``) and the cube (``summary`` from it)."""

    entries: DataFrame
    limit_starts: DataFrame
    cube: DataFrame

    @property
    def summary(self) -> DataFrame:
        """The summary of the cube (built on each access: ``main`` builds its own over the
        persisted cube)."""
        return summary(self.cube)


def audit(raw: DataFrame, intervals_us: Mapping[str, int] | None = None) -> AuditFrames:
    """Every frame of the audit of ``raw`` ledger entries (any number of buckets and exports):
    the annotated timeline, the starts' checks against their extra limits, and the cube (with
    the counted cells of the other entries, the duplicate starts' and the limits' cells).

    The heavy part is one pass: the entries are read and shuffled by bucket once. The
    *timeline* (starts and control actions) is then sorted by time (duplicates from overlapping
    exports are adjacent and dropped, gaps and pauses come from running windows) and folded into
    a small *cube* of numbers per (bucket, worker, second), and into percentile sketches and gap
    counts per (bucket, histogram bin). Every other entry (most of a ledger: grants, waits) is
    only counted, once per (bucket, id), without a sort; so are the holders of each started
    task. The starts whose claims name extra limits are sorted once more, by (bucket, limit),
    within the same partitions. Everything else is computed from the cube."""
    shuffled = _shared(keyed(raw))
    timeline = annotate(shuffled.where(on_timeline()), intervals_us)
    limited = limit_checks(shuffled)
    cube = union_cells(
        cube_of(timeline),
        sketch_cells(timeline),
        counted_cells(shuffled.where(~on_timeline())),
        duplicate_cells(shuffled),
        limit_cells(limited),
    )
    return AuditFrames(timeline, limited, cube)


def _shared(shuffled: DataFrame) -> DataFrame:
    """``shuffled`` read whole by each part of the audit, so that they share one
    scan and one shuffle (Spark reuses an exchange only where the plans below it are equal).
    Observing a metric of every column keeps the optimizer from pushing a part's filter, or
    its choice of columns, below the shuffle; the metric itself is not used."""
    # A count the optimizer cannot fold away: it cannot know that no entry is at now = -1
    # (a count of a column that cannot be null becomes count(1), and the column is dropped).
    every_column = F.when(F.col("now") == -1, F.struct(*shuffled.columns))
    return shuffled.observe(Observation(), F.count(every_column).alias("never"))


# -- I/O ---------------------------------------------------------------------------------------


#: The JVM options of the audit's own session (``conf`` may replace them).
JVM_OPTIONS = "-XX:+UseParallelGC"


def build_session(master: str = "local[*]", conf: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession for the audit on ``master`` (``local[*]``, a cluster's URL, or a Spark
    Connect server's ``sc://host:port``); ``conf`` adds or overrides Spark settings (e.g.
    ``spark.driver.memory``; through Spark Connect only the SQL ones take effect)."""
    builder = SparkSession.builder
    builder = builder.remote(master) if master.startswith("sc://") else builder.master(master)
    builder = (
        builder.appName("celery-interval audit")
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
    # each expression for error messages would add many more of them.
    builder = builder.config("spark.python.sql.dataFrameDebugging.enabled", "false")
    # One plan, made once: the shuffle's partitions are already few, so re-planning at each
    # stage has nothing to gain and only takes time.
    builder = builder.config("spark.sql.adaptive.enabled", "false")
    # A batch job: the throughput collector, not G1, whose background threads and write
    # barriers compete with the tasks for the few cores.
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
