"""An API client limited to one call per second across every worker of the pool.

Run workers with ``celery -A api_client worker -Q api`` on any number of hosts.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_interval import IntervalTask

app = Celery("api_client", broker=os.environ.get("BROKER_URL", "amqp://guest:guest@localhost//"))
app.conf.interval_store_url = os.environ.get("INTERVAL_STORE_URL", "redis://localhost:6379/0")
app.conf.interval_queues = {"api": 1.0}
app.conf.task_routes = {"api_client.call_api": {"queue": "api"}}


@app.task(base=IntervalTask)
def call_api(item_id: int) -> str:
    """Call the rate-sensitive API once for ``item_id`` (a stand-in body)."""
    return f"fetched {item_id}"
