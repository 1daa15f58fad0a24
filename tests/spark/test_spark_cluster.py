"""The audit and the fan-out, unchanged, on a Spark standalone cluster: a master and two
workers started from the installed PySpark (``tools/spark_cluster.py``)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
import redis

from celery_interval.config.table import KEY_PREFIX
from celery_interval.spark import EnqueueCounts, enqueue, task_id_for
from celery_interval.stores.keys import ledger_key
from tests.helpers.brokers import skip_or_fail
from tests.helpers.spark_data import check_known_answers, ledgers  # noqa: F401
from tests.helpers.spark_faults import fail_once_router
from tests.helpers.spark_fixtures import (  # noqa: F401
    queued_task_ids,
    spark_standalone,
    standalone_cluster,
)

ROWS = 2_000
#: The send of partition 0's first attempt that fails it (the sends before it are published).
FAIL_AT = 300


def test_the_session_runs_on_both_workers(spark_standalone: Any) -> None:  # noqa: F811
    """Two executors (one per worker), no local mode: what the other tests run on."""
    sc = spark_standalone.sparkContext
    assert sc.master.startswith("spark://127.0.0.1:")
    deadline = time.monotonic() + 60
    while sc._jsc.sc().getExecutorMemoryStatus().size() < 3 and time.monotonic() < deadline:
        time.sleep(0.5)  # the driver and an executor on each worker
    hosts = spark_standalone.range(8).repartition(8).rdd.mapPartitions(_executor_id).collect()
    assert sc._jsc.sc().getExecutorMemoryStatus().size() == 3
    assert len(set(hosts)) == 2, f"tasks ran on executors {sorted(set(hosts))}"


def _executor_id(rows: Any) -> Any:
    """The executor a task ran on: its Python workers' parent (one PySpark daemon each)."""
    import os

    yield os.getppid()
    for _ in rows:
        pass


def test_audit_known_answers_on_the_cluster(
    spark_standalone: Any,  # noqa: F811
    ledgers: list[str],  # noqa: F811
) -> None:
    check_known_answers(spark_standalone, ledgers)


def test_empty_partitions_send_nothing(
    spark_standalone: Any,  # noqa: F811
    redis_client: Any,
    redis_server: Any,
) -> None:
    broker = redis_server.broker_url_for(0)  # the database redis_client flushed
    df = spark_standalone.range(0, 2, 1, 4).selectExpr("string(id) AS key")
    assert enqueue(df, "t", key="key", broker_url=broker, queue="q") == EnqueueCounts(2, 2)
    assert sorted(queued_task_ids(redis_client, "q")) == sorted(task_id_for("t", k) for k in "01")


@pytest.mark.slow
def test_a_retried_task_sends_its_rows_again_and_each_runs_once(
    spark_standalone: Any,  # noqa: F811
    make_pool: Any,
) -> None:
    """Partition 0's first attempt fails after sending part of its rows; Spark runs it again,
    which sends them all. The broker holds those rows twice, under the same ids; the counts
    are the successful attempts' (each row once), and the workers run each row exactly once
    (the copies are dropped as duplicates)."""
    from pyspark.sql import functions as F

    pool = make_pool(0.002, broker="redis", conf={"interval_ledger_max": 1_000_000})
    df = (
        spark_standalone.range(ROWS)
        .repartition(4)
        .select(F.col("id").cast("int").alias("i"), F.format_string("row-%d", "id").alias("key"))
    )
    faulty = {"task_routes": (fail_once_router(FAIL_AT),)}
    counts = enqueue(df, "workerapp.record", key="key", args=["i"], broker_url=pool.broker,
                     queue=pool.queue, conf=faulty)  # fmt: skip
    assert counts == EnqueueCounts(rows=ROWS, partitions=4)

    ids = {task_id_for("workerapp.record", f"row-{i}"): i for i in range(ROWS)}
    queued = queued_task_ids(redis.Redis.from_url(pool.broker), pool.queue)
    copies = Counter(queued)
    assert set(copies) == set(ids), "every row's id, and only those"
    resent = sum(n - 1 for n in copies.values())
    assert resent == FAIL_AT - 1, "what the failed attempt sent before it failed, sent again"
    assert max(copies.values()) == 2

    pool.start(2, concurrency=1, pool="solo")
    records = pool.wait_records(ROWS, timeout_s=120)
    deadline, dropped = time.monotonic() + 60, 0
    while dropped < resent and time.monotonic() < deadline:
        entries: Any = pool.recorder.xrange(ledger_key(KEY_PREFIX, pool.queue))
        dropped = sum(f[b"op"] in (b"grant:DUPLICATE", b"claim:DUPLICATE") for _, f in entries)
        time.sleep(0.5)
    assert dropped == resent, f"{dropped} of the {resent} copies dropped as duplicates"
    time.sleep(1.0)  # a copy that wrongly ran would have recorded by now
    starts = Counter(r["id"] for r in pool.records() if r["kind"] == "start")
    assert set(starts) == set(ids) and max(starts.values()) == 1, "each row ran exactly once"
    assert all(ids[r["id"]] == r["args"][0] for r in records), "each id carried its row"


def test_the_command_line_starts_and_stops_a_cluster(tmp_path: Any) -> None:
    """``tools/spark_cluster.py start`` leaves a master and its worker running and their ids in
    the state file; ``stop`` ends every one of them."""
    import json
    import os
    import sys

    from tools import spark_cluster

    why = spark_cluster.missing()
    if why is not None:
        skip_or_fail(why)
    state = tmp_path / "state.json"
    argv = ["--workers", "1", "--memory", "512m", "--state", str(state), "--log-dir", str(tmp_path)]
    assert spark_cluster.main(["start", *argv]) == 0
    started = json.loads(state.read_text())
    try:
        assert started["master"].startswith("spark://127.0.0.1:")
        assert spark_cluster.alive_workers(started["web"]) == 1
    finally:
        assert spark_cluster.main(["stop", "--state", str(state)]) == 0
    assert not state.exists()
    for pid in started["pids"]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    check = "import os, sys; sys.exit(not os.environ['SPARK_MASTER_URL'].startswith('spark://'))"
    assert spark_cluster.main(["run", "--workers", "1", "--memory", "512m", "--",
                               sys.executable, "-c", check]) == 0  # fmt: skip
