"""The audit and the fan-out, unchanged, through Spark Connect (``sc://``): a local Connect
server started from the installed PySpark (``tools/spark_cluster.py``)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from celery_interval.headers import SEND_HEADER, SEND_ONCE
from celery_interval.spark import EnqueueCounts, enqueue, task_id_for
from tests.helpers.spark_data import check_known_answers, ledgers  # noqa: F401
from tests.helpers.spark_fixtures import queued_task_ids, spark_connect  # noqa: F401


def test_the_session_is_a_connect_client(spark_connect: Any) -> None:  # noqa: F811
    assert type(spark_connect).__module__ == "pyspark.sql.connect.session"
    assert spark_connect.range(10).count() == 10


def test_audit_known_answers_through_connect(
    spark_connect: Any,  # noqa: F811
    ledgers: list[str],  # noqa: F811
) -> None:
    check_known_answers(spark_connect, ledgers)


def test_audit_main_reuses_the_connect_session(
    spark_connect: Any,  # noqa: F811
    ledgers: list[str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """What ``celery-interval audit`` runs: summary, Parquet, plots and report, written by the
    client; the session it found active runs on."""
    from celery_interval.spark.audit import main

    doc = main(ledgers, tmp_path / "report", intervals_us={"mail": 2_000_000})
    assert doc["ok"] is False and doc["entries"] == 28 + 4 + 8 + 3
    rows = {r["bucket"]: r for r in json.loads((tmp_path / "report/summary.json").read_text())[
        "buckets"]}  # fmt: skip
    assert (rows["api"]["violations"], rows["mail"]["min_gap_s"]) == (1, 1.999999)
    assert (tmp_path / "report/report.html").exists()
    assert list((tmp_path / "report").glob("bucket-*-gaps.png"))
    assert spark_connect.range(3).count() == 3, "the session the audit did not start runs on"


def test_fan_out_through_connect(
    spark_connect: Any,  # noqa: F811
    redis_client: Any,
    redis_server: Any,
) -> None:
    """The counts come from the rows the partitions read (no accumulators in Spark Connect):
    every row once, empty partitions not counted; the messages are those of the classic path."""
    from pyspark.sql import functions as F

    broker = redis_server.broker_url_for(0)  # the database redis_client flushed
    rows = 1_000
    df = spark_connect.range(rows).repartition(3)
    df = df.select(F.col("id").alias("i"), F.format_string("row-%d", "id").alias("key"))
    counts = enqueue(df, "proj.call", key="key", args=["i"], kwargs={"n": "i"},
                     broker_url=broker, queue="q", job="j")  # fmt: skip
    assert counts == EnqueueCounts(rows=rows, partitions=3)
    queued = queued_task_ids(redis_client, "q")
    assert sorted(queued) == sorted(task_id_for("proj.call", f"row-{i}", "j") for i in range(rows))
    message = json.loads(redis_client.lindex("q", 0))
    assert message["headers"][SEND_HEADER] == SEND_ONCE
    assert message["headers"]["task"] == "proj.call"
    args, kwargs, _ = json.loads(base64.b64decode(message["body"]))
    assert kwargs == {"n": args[0]}, "the row's columns, as the classic path sends them"
    assert message["headers"]["id"] == task_id_for("proj.call", f"row-{args[0]}", "j")

    redis_client.delete("q")
    two = spark_connect.range(0, 2, 1, 4).selectExpr("string(id) AS key")
    assert enqueue(two, "t", key="key", broker_url=broker, queue="q") == EnqueueCounts(2, 2)
    assert len(queued_task_ids(redis_client, "q")) == 2


def test_fan_out_through_connect_across_a_task_retry(
    spark_connect: Any,  # noqa: F811
    redis_client: Any,
    redis_server: Any,
) -> None:
    """Partition 0's first attempt fails at its 300th send and is run again: its 299 rows are
    in the broker twice under the same ids, and the observed counts are each row once (the
    failed attempt's metrics are dropped)."""
    from collections import Counter

    from pyspark.sql import functions as F

    from tests.helpers.spark_faults import fail_once_router

    df = spark_connect.range(0, 2_000, 1, 4)
    df = df.select(F.col("id").alias("i"), F.format_string("row-%d", "id").alias("key"))
    counts = enqueue(df, "t", key="key", args=["i"], broker_url=redis_server.broker_url_for(0),
                     queue="q", conf={"task_routes": (fail_once_router(300),)})  # fmt: skip
    assert counts == EnqueueCounts(rows=2_000, partitions=4)
    copies = Counter(queued_task_ids(redis_client, "q"))
    assert set(copies) == {task_id_for("t", f"row-{i}") for i in range(2_000)}
    assert Counter(copies.values()) == {1: 2_000 - 299, 2: 299}
