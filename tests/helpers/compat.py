"""A pool of real workers running ``compatapp``, and the body starts its tasks record."""

from __future__ import annotations

import json
from typing import Any

from celery_interval.demo.embedded import RedisProc
from tests.helpers import compatapp
from tests.helpers.pool import Pool

INTERVAL_S = 0.05


def compat_pool(redis_server: RedisProc, tmp: Any, broker: str = "", **kwargs: Any) -> Pool:
    """A pool of real workers running ``compatapp`` on the private Redis (broker db 1)."""
    if not redis_server.alive:
        redis_server.restart()
    kwargs.setdefault("conf", {})
    kwargs["conf"].setdefault("task_track_started", True)
    kwargs["conf"].setdefault("worker_send_task_events", True)
    pool = Pool(
        broker=broker or redis_server.broker_url_for(1),
        store=redis_server.url_for(0),
        interval_s=INTERVAL_S,
        tmp=tmp,
        app_module="tests.helpers.compatapp",
        app_factory=compatapp.make_app,
        **kwargs,
    )
    compatapp.define(pool.app)
    return pool


def starts(pool: Pool, task_id: str | None = None) -> list[dict[str, Any]]:
    """Body starts recorded by ``compatapp.record`` (of one task id)."""
    raw = pool.recorder.lrange(f"compat:{pool.queue}", 0, -1)
    entries = [json.loads(r) for r in raw]
    return [e for e in entries if task_id is None or e["id"] == task_id]
