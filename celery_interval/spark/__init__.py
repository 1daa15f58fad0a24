"""The data pipeline on Spark (the ``spark`` extra): the ledger audit and the DataFrame fan-out."""

from __future__ import annotations

import importlib.util
import os
import shutil

from celery_interval.spark.enqueue import EnqueueCounts, enqueue, task_id_for

__all__ = ["EnqueueCounts", "enqueue", "missing_requirement", "task_id_for"]


def missing_requirement() -> str | None:
    """Why the Spark pipeline cannot run here (no PySpark, no Java), or None when it can."""
    try:
        found = importlib.util.find_spec("pyspark") is not None
    except (ImportError, ValueError):  # ValueError: sys.modules["pyspark"] is None
        found = False
    if not found:
        return (
            "PySpark is not installed: the audit needs the spark extra "
            "(pip install 'celery-interval[spark]')"
        )
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK)) and not (
        shutil.which("java")
    ):
        return "Spark needs Java 17 or later: no `java` on PATH and no JAVA_HOME/bin/java"
    return None
