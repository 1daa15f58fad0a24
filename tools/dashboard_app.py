"""The Celery app of the dashboard run (tools/dashboard_png.py): one 50 ms queue ``api`` and
two tenants of it at their task's own 100 ms, configured from the environment."""

from __future__ import annotations

import os
import random
import time

from celery import Celery

from celery_interval import IntervalTask

app = Celery(
    "dashboard",
    broker=os.environ.get("DASHBOARD_BROKER", "memory://"),
    set_as_current=False,
)
app.conf.update(
    interval_store_url=os.environ.get("DASHBOARD_STORE", "memory://"),
    interval_queues={"api": 0.05},
    task_default_queue="api",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(base=IntervalTask, name="dashboard.call_api")
def call_api(i: int) -> int:
    """A call of 0-30 ms."""
    time.sleep(random.uniform(0, 0.03))
    return i


@app.task(
    base=IntervalTask,
    name="dashboard.tenant_call",
    interval=0.1,
    interval_bucket=lambda args, kwargs: args[0],
)
def tenant_call(tenant: str, i: int) -> int:
    """A tenant's call (bucket ``api:<tenant>``) of 0-30 ms."""
    time.sleep(random.uniform(0, 0.03))
    return i
