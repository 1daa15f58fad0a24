"""Fan-out at scale: 1 million DataFrame rows enqueued from a Spark standalone cluster.

    python bench/spark_fanout.py [--rows 1000000] [--partitions 8] [--workers 2] [--fail-at 50000]

Starts a private redis-server (the broker) and, with ``tools/spark_cluster.py``, a standalone
master and ``--workers`` workers of one core each; then ``celery_interval.spark.enqueue`` sends
one task per row of ``spark.range(rows)`` (the key ``row-<n>``) from the executors, timed.
With ``--fail-at N`` the first attempt of partition 0 fails at its N-th send (a Celery router
that raises, ``tests/helpers/spark_faults.py``), so that Spark runs that task again and it sends
its rows a second time. Then every message in the broker's queue is read back: messages out,
distinct task ids, ids sent twice, and whether the ids are exactly the rows' ids. No worker
consumes them (the run-once side is ``tests/spark/test_spark_cluster.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from celery_interval.demo.embedded import RedisProc  # noqa: E402
from celery_interval.spark import enqueue, task_id_for  # noqa: E402
from tests.helpers.spark_faults import fail_once_router  # noqa: E402
from tests.helpers.spark_fixtures import queued_task_ids  # noqa: E402
from tools import spark_cluster  # noqa: E402

TASK, QUEUE = "bench.record", "fanout"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker-memory", default="2g")
    parser.add_argument("--fail-at", type=int, default=0, help="fail partition 0 once, there")
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    with RedisProc() as broker, spark_cluster.standalone(args.workers, 1, args.worker_memory) as c:
        spark = (
            SparkSession.builder.master(str(c.master))
            .appName("bench spark fan-out")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.executor.memory", args.worker_memory)
            .config("spark.pyspark.python", sys.executable)
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        df = spark.range(0, args.rows, 1, args.partitions).select(
            F.col("id").alias("i"), F.format_string("row-%d", "id").alias("key")
        )
        conf = {"task_routes": (fail_once_router(args.fail_at),)} if args.fail_at else {}
        started = time.monotonic()
        counts = enqueue(df, TASK, key="key", args=["i"], broker_url=broker.broker_url_for(0),
                         queue=QUEUE, conf=conf)  # fmt: skip
        seconds = time.monotonic() - started
        spark.stop()

        client = redis.Redis.from_url(broker.url)
        queued = queued_task_ids(client, QUEUE)
        copies = Counter(queued)
        expected = {task_id_for(TASK, f"row-{n}") for n in range(args.rows)}
        doc = {
            "rows_in": args.rows,
            "counts": {"rows": counts.rows, "partitions": counts.partitions},
            "messages_out": len(queued),
            "distinct_ids": len(copies),
            "ids_sent_twice": sum(n == 2 for n in copies.values()),
            "ids_sent_more": sum(n > 2 for n in copies.values()),
            "ids_are_the_rows": set(copies) == expected,
            "seconds": round(seconds, 1),
            "rows_per_s": round(args.rows / seconds),
            "broker_used_mb": round(int(client.info("memory")["used_memory"]) / 2**20),
            "cluster": f"master + {args.workers} workers x 1 core, {args.worker_memory}",
            "partitions": args.partitions,
            "fail_at": args.fail_at,
        }
        print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
