"""Spark sessions for the tests: local[2], a standalone cluster (master and two workers) and a
Spark Connect server, each from the installed PySpark; none can start: skip (CI: fail)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from celery_interval.spark import missing_requirement
from tests.helpers.brokers import skip_or_fail

#: The settings of every classic test session: no UI, few partitions, tiny data interpreted
#: (interpreting beats compiling on it: the first query ~2x faster, same results).
TEST_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


def require_spark() -> None:
    """Skip when PySpark or Java is missing (under CI=true: fail)."""
    why = missing_requirement()
    if why is not None:
        skip_or_fail(why)


def classic_session(master: str, conf: dict[str, str] | None = None) -> Any:
    """The process's one classic SparkSession on ``master``: the running one when it is on
    ``master``, else that one is stopped (one SparkContext per process) and a new one built."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        if active.sparkContext._jsc is not None and active.sparkContext.master == master:
            return active
        active.stop()
    builder = SparkSession.builder.master(master).appName("celery-interval tests")
    for key, value in {**TEST_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


@pytest.fixture(scope="session")
def _stop_classic_session() -> Iterator[None]:
    """Stop whichever classic session the tests left running, after the test session."""
    yield
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


@pytest.fixture
def spark(_stop_classic_session: None) -> Any:
    """The local[2] SparkSession (no UI, 2 shuffle partitions), made once and kept for the
    session (made again after a test on a cluster stopped it)."""
    require_spark()
    return classic_session("local[2]")


@pytest.fixture(scope="module")
def standalone_cluster() -> Iterator[Any]:
    """A standalone master and two workers (1 core, 1 GiB each) from the installed PySpark,
    for the module (``tools/spark_cluster.py``)."""
    from tools import spark_cluster

    why = spark_cluster.missing()
    if why is not None:
        skip_or_fail(why)
    with spark_cluster.standalone(workers=2, cores=1, memory="1g") as cluster:
        yield cluster


@pytest.fixture
def spark_standalone(standalone_cluster: Any, _stop_classic_session: None) -> Any:
    """A classic SparkSession on the standalone cluster (``spark://``), its executors on both
    workers (the local[2] session is stopped meanwhile: one SparkContext per process)."""
    conf = {"spark.executor.cores": "1", "spark.executor.memory": "1g", "spark.cores.max": "2",
            "spark.pyspark.python": sys.executable}  # fmt: skip
    return classic_session(standalone_cluster.master, conf)


@pytest.fixture(scope="module")
def spark_connect() -> Iterator[Any]:
    """A Spark Connect session (``sc://``) on a local Connect server (its Spark on
    local[2,2]: a failed task is tried again) started from the installed PySpark, for the
    module. Afterwards this process is
    no longer in Connect mode (PySpark's builder turns it on for the whole process, and the
    local sessions of other tests are classic ones)."""
    import os

    from tools import spark_cluster

    why = spark_cluster.missing_connect()
    if why is not None:
        skip_or_fail(why)
    conf = {k: v for k, v in TEST_CONF.items() if k != "spark.ui.enabled"}
    with spark_cluster.connect_server(workers=0, conf=conf, local="local[2,2]") as server:
        from pyspark.sql import SparkSession

        classic = SparkSession.getActiveSession()
        if classic is not None:  # PySpark starts no remote session beside a classic one
            classic.stop()
        before = os.environ.get("SPARK_CONNECT_MODE_ENABLED")
        session = SparkSession.builder.remote(server.remote).getOrCreate()
        try:
            yield session
        finally:
            session.stop()
            if before is None:
                os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


def queued_task_ids(client: Any, queue: str) -> list[str]:
    """The task id of every message waiting in ``queue`` on a Redis broker (kombu keeps a
    queue as a list of JSON messages), in the order they were sent; copies included."""
    import json

    ids: list[str] = []
    for start in range(0, int(client.llen(queue)), 10_000):
        for raw in client.lrange(queue, start, start + 9_999):
            ids.append(json.loads(raw)["headers"]["id"])
    return ids[::-1]  # kombu pushes on the left
