"""One local[2] SparkSession for the whole test session; no PySpark or Java: skip (CI: fail)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_interval.spark import missing_requirement
from tests.helpers.brokers import skip_or_fail


def require_spark() -> None:
    """Skip when PySpark or Java is missing (under CI=true: fail)."""
    why = missing_requirement()
    if why is not None:
        skip_or_fail(why)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession (no UI, 2 shuffle partitions), stopped after the session."""
    require_spark()
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("celery-interval tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        # Tiny test data: interpreting beats compiling (first query ~2x faster, same results).
        .config("spark.sql.codegen.wholeStage", "false")
        .config("spark.sql.codegen.factoryMode", "NO_CODEGEN")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
