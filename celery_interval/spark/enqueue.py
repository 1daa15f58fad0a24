"""Fan a DataFrame out into an interval queue from Spark's executors, with deterministic ids."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery_interval.errors import ConfigurationError
from celery_interval.headers import SEND_HEADER, SEND_ONCE

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

__all__ = ["ID_NAMESPACE", "EnqueueCounts", "enqueue", "task_id_for"]

#: The uuid5 namespace of the task ids ``enqueue`` derives (fixed: ids must never change).
ID_NAMESPACE = uuid.UUID("6f3c1e52-8d0b-5a8e-9b7e-2f61c0d4a9b3")


@dataclass(frozen=True)
class EnqueueCounts:
    """What one ``enqueue`` call sent: rows (messages) and the partitions that sent them
    (one producer each)."""

    rows: int
    partitions: int


@dataclass(frozen=True, eq=False)
class _AppSpec:
    """How an executor builds the Celery app: an importable app, or a bare app on a broker."""

    app: str | None
    broker_url: str | None
    conf: tuple[tuple[str, Any], ...]


_apps: dict[str, Any] = {}  # repr(spec) -> app: one app and producer pool per executor process


def task_id_for(task_name: str, key: object, job: str = "") -> str:
    """The task id of the row whose key is ``key``: uuid5 over ``job``, the task name and
    ``str(key)``, so the same row of the same job always gets the same id."""
    return str(uuid.uuid5(ID_NAMESPACE, "\x1f".join((job, task_name, str(key)))))


def _app_for(spec: _AppSpec) -> Any:
    app = _apps.get(repr(spec))
    if app is None:
        if spec.app is not None:
            from celery.app.utils import find_app

            app = find_app(spec.app)
        else:
            from celery import Celery

            app = Celery("celery_interval.spark.enqueue", broker=spec.broker_url)
            app.conf.update(dict(spec.conf))
        _apps[repr(spec)] = app
    return app


def _send_partition(
    rows: Iterable[Row],
    *,
    spec: _AppSpec,
    task_name: str,
    key: str,
    args: tuple[str, ...],
    kwargs: tuple[tuple[str, str], ...],
    job: str,
    queue: str | None,
    options: tuple[tuple[str, Any], ...],
    sent: Any = None,
    partitions: Any = None,
) -> None:
    """Send one partition's rows through one producer, streaming (never a whole partition)."""
    app = _app_for(spec)
    count = 0
    with app.producer_or_acquire() as producer:
        for row in rows:
            value = row[key]
            if value is None:
                raise ConfigurationError(f"key column {key!r} is null in row {row!r}")
            app.send_task(
                task_name,
                args=[row[c] for c in args],
                kwargs={name: row[c] for name, c in kwargs},
                task_id=task_id_for(task_name, value, job),
                queue=queue,
                producer=producer,
                **sent_once(dict(options)),
            )
            count += 1
    if sent is not None:
        sent.add(count)
        partitions.add(int(count > 0))


def sent_once(options: dict[str, Any]) -> dict[str, Any]:
    """``send_task`` options whose headers ask for one run per task id: a row sent again by a
    retried task or a re-run stage is a duplicate, not a new send."""
    return {**options, "headers": {**(options.get("headers") or {}), SEND_HEADER: SEND_ONCE}}


def enqueue(
    df: DataFrame,
    task: str | Any,
    *,
    key: str,
    args: Sequence[str] = (),
    kwargs: Sequence[str] | Mapping[str, str] = (),
    app: str | None = None,
    broker_url: str | None = None,
    conf: Mapping[str, Any] | None = None,
    queue: str | None = None,
    job: str = "",
    options: Mapping[str, Any] | None = None,
) -> EnqueueCounts:
    """Send one ``task`` message per row of ``df`` from the executors (``foreachPartition``,
    one producer per partition, rows streamed) and return the counts. ``df`` is a classic or
    a Spark Connect DataFrame.

    ``task`` is a task name (or a task, whose name is used). Each row's task id is
    ``task_id_for(task name, row[key], job)``: a retried Spark task or a re-run job sends the
    same ids again, and the workers' dedupe drops every copy of a task already done (within
    ``interval_dedupe_ttl_s``), so no row runs twice. Keys must be unique within a job; pass a
    new ``job`` to run the same rows again on purpose.

    ``args`` names the columns passed positionally; ``kwargs`` the columns passed by name
    (a mapping renames: parameter -> column). The executors build the app either from
    ``app``, an import path as in ``celery -A`` (``"proj.celery:app"``; the module must be
    importable there), or from ``broker_url`` and ``conf`` (a bare app: no task code needed).
    ``queue`` defaults to the app's routing; ``options`` go to ``send_task`` (e.g. priority).
    """
    if (app is None) == (broker_url is None):
        raise ConfigurationError(
            "enqueue needs exactly one of app= (an import path as in `celery -A`) or broker_url="
        )
    task_name = _task_name_of(task)
    named = tuple(kwargs.items()) if isinstance(kwargs, Mapping) else tuple((c, c) for c in kwargs)
    _check_columns(df, (key, *args, *(c for _, c in named)))
    if app is not None:
        _check_app_imports(app)
    send = functools.partial(
        _send_partition,
        spec=_AppSpec(app, broker_url, tuple(sorted((conf or {}).items()))),
        task_name=task_name,
        key=key,
        args=tuple(args),
        kwargs=named,
        job=job,
        queue=queue,
        options=tuple(sorted((options or {}).items())),
    )
    if type(df).__module__.startswith("pyspark.sql.connect"):
        return _enqueue_remote(df, send)
    return _enqueue_classic(df, send)


def _task_name_of(task: str | Any) -> str:
    """The name of ``task``: a task name, or a Celery task's ``name``."""
    task_name = task if isinstance(task, str) else getattr(task, "name", None)
    if not isinstance(task_name, str) or not task_name:
        raise ConfigurationError(f"task={task!r}: expected a task name or a Celery task")
    return task_name


def _check_columns(df: DataFrame, columns: Iterable[str]) -> None:
    """Raise ``ConfigurationError`` naming the first of ``columns`` that ``df`` lacks."""
    present = set(df.columns)
    for column in columns:
        if column not in present:
            raise ConfigurationError(
                f"column {column!r} is not in the DataFrame (columns: {', '.join(df.columns)})"
            )


def _check_app_imports(app: str) -> None:
    """Import ``app`` as the executors will, so that a typo fails here, before any send."""
    from celery.app.utils import find_app

    try:
        find_app(app)
    except Exception as exc:
        raise ConfigurationError(f"app={app!r}: cannot import it: {exc}") from exc


def _enqueue_classic(df: DataFrame, send: Any) -> EnqueueCounts:
    """``enqueue`` on a classic session: the partition function, counted by accumulators."""
    sc = df.sparkSession.sparkContext
    sent, partitions = sc.accumulator(0), sc.accumulator(0)
    df.foreachPartition(functools.partial(send, sent=sent, partitions=partitions))
    return EnqueueCounts(rows=int(sent.value), partitions=int(partitions.value))


def _enqueue_remote(df: DataFrame, send: Any) -> EnqueueCounts:
    """``enqueue`` through Spark Connect, which has no accumulators: the same partition
    function, counted by an observation of the rows it reads (the metrics of a failed task
    attempt are dropped, as its accumulator updates are)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    counts, part = Observation(), "__celery_interval_partition"
    observed = (
        df.withColumn(part, F.spark_partition_id())  # (observed metrics take only aggregates)
        .observe(counts, F.count(F.lit(1)).alias("rows"), F.size(F.collect_set(part)).alias("p"))
        .drop(part)
    )
    observed.foreachPartition(send)
    got = counts.get
    return EnqueueCounts(rows=int(got["rows"]), partitions=int(got["p"]))
