"""Per-tenant buckets: each tenant gets its own interval; tenants do not slow each other down.

The bucket callable gets the call's (args, kwargs) and returns a key; the bucket is
``<queue>:<key>`` (here ``reports:acme``), with the queue's interval unless the task sets one.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_interval import IntervalTask

app = Celery("tenants", broker=os.environ.get("BROKER_URL", "amqp://guest:guest@localhost//"))
app.conf.interval_store_url = os.environ.get("INTERVAL_STORE_URL", "redis://localhost:6379/0")
app.conf.interval_queues = {"reports": "30/m"}
app.conf.task_routes = {"tenants.build_report": {"queue": "reports"}}


@app.task(base=IntervalTask, interval_bucket=lambda args, kwargs: kwargs["tenant"])
def build_report(report_id: int, *, tenant: str) -> str:
    """Build one report; at most 30 per minute per tenant, pool-wide."""
    return f"{tenant}/{report_id}"
