"""The Celery side of the bench workload: one body, four ways to space its starts.

Run by the bench as ``celery -A workload_celery worker`` with ``bench/`` on PYTHONPATH.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery.signals import worker_process_init, worker_ready
from recording import (
    ENV_BROKER,
    ENV_RATE_LIMIT,
    ENV_STORE,
    ENV_TASK,
    QUEUE,
    conf,
    interval_s,
    record_ready,
    record_start,
    recorder,
)

from celery_interval import IntervalTask
from celery_interval.demo.app import make_app

INTERVAL_S = interval_s()
GATE_KEY = "bench:diy:gate"

app = make_app(os.environ[ENV_BROKER], os.environ[ENV_STORE], QUEUE, INTERVAL_S, **conf())
if os.environ.get(ENV_TASK) not in ("bench.interval", "bench.tenant"):
    # Every task consumed from an interval queue is paced: the other systems' queue is none.
    app.conf.interval_queues = {}
_gate: redis.Redis | None = None


def gate() -> redis.Redis:
    """The DIY pattern's connection to Redis (the store's server)."""
    global _gate
    if _gate is None:
        _gate = redis.Redis.from_url(os.environ[ENV_STORE])
    return _gate


@worker_process_init.connect
def _open_connections(**_: Any) -> None:
    # Connections are opened before the first task, so no first start pays for them.
    recorder()
    gate().ping()
    record_ready("pool-child")


@worker_ready.connect
def _ready(**_: Any) -> None:
    record_ready("worker")


def _record(task: Any, i: int) -> int:
    record_start(task.request.id, i, task.request.retries, task.request.hostname or "")
    return i


if os.environ.get(ENV_TASK) == "bench.interval":
    # Only then: the other systems' workers run plain Celery, without the interval bootstep.

    @app.task(base=IntervalTask, bind=True, name="bench.interval")
    def interval_task(self: Any, i: int) -> int:
        """celery_interval: IntervalTask spaces the starts of its queue."""
        return _record(self, i)


if os.environ.get(ENV_TASK) == "bench.tenant":

    @app.task(
        base=IntervalTask,
        bind=True,
        name="bench.tenant",
        interval_bucket=lambda args, kwargs: args[0],
    )
    def tenant_task(self: Any, key: str, i: int) -> int:
        """celery_interval with one bucket per key (``bench:<key>``), for bench/tenants.py."""
        record_start(self.request.id, i, self.request.retries, self.request.hostname or "", key)
        return i


@app.task(bind=True, name="bench.rate_limited", rate_limit=os.environ.get(ENV_RATE_LIMIT) or None)
def rate_limited(self: Any, i: int) -> int:
    """Celery's own rate_limit (a token bucket in each worker)."""
    return _record(self, i)


@app.task(bind=True, name="bench.diy", max_retries=None)
def diy_set_nx_retry(self: Any, i: int) -> int:
    """The pattern users write: a Redis SET NX PX gate, retry with a countdown when taken."""
    if not gate().set(GATE_KEY, 1, nx=True, px=max(1, round(INTERVAL_S * 1000))):
        raise self.retry(countdown=INTERVAL_S)
    return _record(self, i)


@app.task(bind=True, name="bench.plain_tenant")
def plain_tenant(self: Any, key: str, i: int) -> int:
    """No spacing, the tenant task's arguments: the baseline of bench/scaling.py."""
    record_start(self.request.id, i, self.request.retries, self.request.hostname or "", key)
    return i


@app.task(bind=True, name="bench.plain")
def plain(self: Any, i: int) -> int:
    """No spacing at all: the baseline for per-task overhead."""
    return _record(self, i)
