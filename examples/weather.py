"""A weather API client: the provider allows one call per second across all our workers.

Run workers with ``celery -A weather worker -Q weather`` on any number of hosts;
``test_weather.py`` beside this file tests it with ``celery_interval.testing``.
"""

from __future__ import annotations

import os

from celery import Celery

from celery_interval import IntervalTask

app = Celery("weather", broker=os.environ.get("BROKER_URL", "redis://localhost:6379/0"))
app.conf.interval_queues = {"weather": 1.0}
app.conf.task_routes = {"weather.fetch_forecast": {"queue": "weather"}}


@app.task(base=IntervalTask)
def fetch_forecast(city: str) -> str:
    """Call the provider for ``city`` (a stand-in body)."""
    return f"forecast for {city}"
