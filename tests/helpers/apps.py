"""Celery apps the unit tests configure in-process: declared queues on a memory store, and
bucket api on a real Redis."""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_interval.demo.embedded import RedisProc

INTERVAL_S = 0.1


def make_app(server: RedisProc, **api: Any) -> Celery:
    """An app with bucket api at INTERVAL_S and the declaration's fields ``api``."""
    app = Celery("inline", set_as_current=False)
    declared = {"api": {"interval": INTERVAL_S, **api}}
    app.conf.update(interval_store_url=server.url, interval_queues=declared)
    return app


def memory_app(**queues: Any) -> Celery:
    """An app on a memory store with queue api at 0.05 s and the declarations ``queues``."""
    app = Celery("limitsconf", broker="memory://", set_as_current=False)
    app.conf.update(interval_store_url="memory://", interval_queues={"api": 0.05, **queues})
    return app
