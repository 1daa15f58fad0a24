"""Audit throughput: 10 million synthetic ledger entries (JSON lines) audited on local[2].

    python bench/audit.py [--entries 10000000] [--buckets 100] [--keep DIR]
    python bench/audit.py --cluster 2 [--worker-memory 4g] [--format parquet] [--conf K=V]

Spark itself writes the synthetic ledger (as `interval ledger export` would, one JSON object
per entry; or Parquet with ``--format parquet``) into a temporary directory; then a fresh
process runs the audit on local[2] (``--master`` another URL; ``--cluster N`` a standalone
master and N workers of one core each, started by ``tools/spark_cluster.py``) while this one
samples the memory of that process and its JVM. Prints seconds (with and without the JVM
start), entries per second and the peak resident memory of the driver (python + JVM; a
cluster's executors are other processes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

T0_US = 1_800_000_000_000_000
INTERVAL_US = 20_000
#: Entries per task cycle: grant:OK, claim:WAIT, claim:OK, grant:OK, claim:OK (2 starts in 5).
CYCLE = 5


def generate(out: Path, entries: int, buckets: int, fmt: str = "json") -> float:
    """Write ``entries`` ledger entries spread over ``buckets`` as JSON lines (or Parquet);
    returns s."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench audit: generate")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    started = time.monotonic()
    i = F.col("id")
    k = F.floor(i / buckets)  # the entry's position in its bucket
    step = k % CYCLE
    task_n = F.floor(k / CYCLE) * 2 + F.when(step >= 3, 1).otherwise(0)
    # Slots 3 ms more than an interval apart and lateness 0-3 ms: no start comes too early.
    slot = F.lit(T0_US) + task_n * (INTERVAL_US + 3_000)
    late = (F.hash(i) % 3000 + 3000) % 3000  # 0-3 ms
    now = slot + F.when(step == 0, -500_000).when(step == 3, -400_000).otherwise(late - 8_000)
    is_start = step.isin(2, 4)
    start = slot + late
    # a pause every 10,000 entries of a bucket, an unpause 10 entries later
    control = F.when(k % 10_000 == 5_000, "pause").when(k % 10_000 == 5_010, "unpause")
    op = F.coalesce(
        control,
        F.when(step.isin(0, 3), "grant:OK").when(step == 1, "claim:WAIT").otherwise("claim:OK"),
    )
    worker = F.concat(F.lit("w"), (F.hash(task_n, i % buckets) % 3 + 3) % 3, F.lit("@host"))
    df = spark.range(entries).select(
        F.format_string("b%03d", i % buckets).alias("bucket"),
        F.format_string("%d-%d", F.floor(now / 1000), k).alias("id"),
        op.alias("op"),
        now.alias("now"),
        F.format_string("%08d-0000-4000-8000-%012d", task_n, i % buckets).alias("task"),
        F.lit(0).alias("r"),
        (task_n + 1).alias("ticket"),
        slot.alias("slot"),
        F.lit(T0_US).alias("epoch"),
        F.when(control.isNotNull(), 1).alias("changed"),
        F.lit(INTERVAL_US).alias("interval"),
        F.when(is_start & control.isNull(), F.concat(worker, F.lit("/0123456789ab"))).alias(
            "holder"
        ),
        F.when(is_start & control.isNull(), start).alias("start"),
        F.when(is_start & control.isNull(), late).alias("late"),
        F.when(step == 1, 8_000 - late).alias("delay"),
    )
    df.write.mode("overwrite").format(fmt).save(str(out))
    seconds = time.monotonic() - started
    spark.stop()
    return seconds


def _tree_rss_bytes(pid: int) -> int:
    """RSS of ``pid`` and its descendants (the driver python and its JVM), from /proc."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            with open(f"/proc/{p}/task/{p}/children") as f:
                stack.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return total


def child(ledger: str, out: str, master: str, conf: str) -> None:
    """The measured process: start Spark on ``master``, run the audit, print timings as
    JSON."""
    from celery_interval.spark.audit import build_session, main

    started = time.monotonic()
    spark = build_session(master, json.loads(conf))
    spark.sparkContext.setLogLevel("ERROR")
    ready = time.monotonic()
    doc = main([ledger], out)
    done = time.monotonic()
    spark.stop()
    print(json.dumps({"session_s": ready - started, "audit_s": done - ready, "doc": {
        "entries": doc["entries"], "buckets": len(doc["buckets"]), "ok": doc["ok"],
        "starts": sum(b["starts"] for b in doc["buckets"]),
        "violations": sum(b["violations"] or 0 for b in doc["buckets"]),
    }}))  # fmt: skip


def measure(ledger: Path, out: Path, master: str, conf: dict[str, str]) -> dict[str, Any]:
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", str(ledger), str(out), master, json.dumps(conf)],
        stdout=subprocess.PIPE,
        text=True,
    )
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss_bytes(proc.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, _ = proc.communicate()
    wall_s = time.monotonic() - started
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"audit failed with exit status {proc.returncode}")
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    result.update(wall_s=wall_s, peak_rss_mb=peak[0] / 2**20)
    return result


def to_parquet(ledger: Path, out: Path) -> None:
    from pyspark.sql import SparkSession

    from celery_interval.spark.entries import LEDGER_SCHEMA

    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    )
    spark.read.schema(LEDGER_SCHEMA).json(str(ledger)).write.parquet(str(out))
    spark.stop()


def report(name: str, r: dict[str, Any], where: str) -> None:
    doc = r["doc"]
    entries = doc["entries"]
    print(f"audit of {entries:,} entries ({name}) in {doc['buckets']} buckets "
          f"({doc['starts']:,} starts, {doc['violations']} violations) on {where}:")  # fmt: skip
    print(f"  audit      {r['audit_s']:.1f} s  ({entries / r['audit_s']:,.0f} entries/s)")
    print(f"  with JVM   {r['wall_s']:.1f} s  ({entries / r['wall_s']:,.0f} entries/s)")
    print(f"  peak RSS   {r['peak_rss_mb']:,.0f} MiB (driver python + JVM)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=10_000_000)
    parser.add_argument("--buckets", type=int, default=100)
    parser.add_argument("--keep", help="Reuse or keep the generated ledger in this directory.")
    parser.add_argument(
        "--parquet", action="store_true", help="Also audit a Parquet copy of the same entries."
    )
    parser.add_argument(
        "--format",
        choices=("json", "parquet"),
        default="json",
        help="how the synthetic ledger is written",
    )
    parser.add_argument("--master", default="local[2]", help="where the audit runs")
    parser.add_argument(
        "--cluster",
        type=int,
        metavar="N",
        help="start a standalone master and N workers (1 core each) for it",
    )
    parser.add_argument("--worker-memory", default="4g", help="--cluster: each worker's memory")
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting of the audit's session",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    conf = dict(kv.split("=", 1) for kv in args.conf)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-audit-"))
    ledger = work / ("ledger" if args.format == "json" else "ledger.parquet")
    cluster = None
    try:
        if not (ledger / "_SUCCESS").exists():
            gen_s = generate(ledger, args.entries, args.buckets, args.format)
            size = sum(f.stat().st_size for f in ledger.glob("part-*"))
            print(f"generated {args.entries:,} entries ({size / 2**30:.2f} GiB) in {gen_s:.1f}s")
        master, where = args.master, args.master
        if args.cluster:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from tools import spark_cluster

            cluster = spark_cluster.start(args.cluster, 1, args.worker_memory)
            master = str(cluster.master)
            where = f"a standalone master and {args.cluster} workers (1 core, {args.worker_memory})"
            conf.setdefault("spark.executor.memory", args.worker_memory)
            conf.setdefault("spark.pyspark.python", sys.executable)
        inputs = [("JSON lines" if args.format == "json" else "Parquet", ledger)]
        if args.parquet and args.format == "json":
            copy = work / "ledger.parquet"
            if not copy.exists():
                to_parquet(ledger, copy)
            inputs.append(("Parquet", copy))
        for name, path in inputs:
            report(name, measure(path, work / "report", master, conf), where)
    finally:
        if cluster is not None:
            cluster.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
