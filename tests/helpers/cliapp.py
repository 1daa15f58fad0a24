"""A small app for the CLI tests, configured from the environment at import."""

from __future__ import annotations

import os

from celery import Celery

import celery_interval  # noqa: F401  (registers the control commands, as a task module would)

app = Celery("cliapp", broker=os.environ["CLI_TEST_BROKER"], set_as_current=False)
app.conf.interval_store_url = os.environ["CLI_TEST_STORE"]
app.conf.interval_queues = {"api": 1.0, "mail": "30/m"}
app.conf.interval_burst = {"api": 3}
app.conf.interval_limits = {"api": ["100/min", ("1000/h", 50)]}
app.conf.interval_interactive_share = {"api": 0.2}
