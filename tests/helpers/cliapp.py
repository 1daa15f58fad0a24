"""A small app for the CLI tests, configured from the environment at import."""

from __future__ import annotations

import os

from celery import Celery

import celery_interval  # noqa: F401  (registers the control commands, as a task module would)

app = Celery("cliapp", broker=os.environ["CLI_TEST_BROKER"], set_as_current=False)
app.conf.interval_store_url = os.environ["CLI_TEST_STORE"]
app.conf.interval_queues = {
    "api": {
        "interval": 1.0,
        "burst": 3,
        "limits": ["100/min", ("1000/h", 50)],
        "interactive_share": 0.2,
    },
    "mail": "30/m",
}
