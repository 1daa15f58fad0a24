"""The demo's worker app (``celery -A celery_interval.demo.app worker``), configured by env."""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import redis
from celery import Celery
from celery.signals import worker_process_init

from celery_interval.stores.urls import is_redis_url
from celery_interval.task import IntervalTask

__all__ = ["QUEUE", "RECORD_KEY", "app", "make_app", "record_start"]

QUEUE = os.environ.get("CELERY_INTERVAL_DEMO_QUEUE", "demo")
RECORD_KEY = "celery_interval:demo:starts"


def make_app(broker: str, store: str, queue: str, interval_s: float, **conf: Any) -> Celery:
    """A Celery app with one interval queue ``queue`` (and any further settings);
    ``conf["interval_queues"]`` adds declarations, the queue's merged over ``interval_s``
    (``{queue: {"adaptive": True}}`` keeps the interval)."""
    queues: dict[str, Any] = {queue: interval_s}
    for name, declared in conf.pop("interval_queues", {}).items():
        merged = name == queue and isinstance(declared, dict)
        queues[name] = {"interval": interval_s, **declared} if merged else declared
    app = Celery("celery_interval_demo", broker=broker, set_as_current=False)
    app.conf.update(
        interval_store_url=store,
        interval_queues=queues,
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        **conf,
    )
    return app


_conn: redis.Redis | None = None


def record_start(store_url: str, key: str, entry: dict[str, Any]) -> None:
    """Append ``entry`` with the store's clock (µs) to the list ``key``."""
    global _conn
    if _conn is None:
        _conn = redis.Redis.from_url(store_url)
    seconds, micros = _conn.time()
    entry["us"] = int(seconds) * 1_000_000 + int(micros)
    _conn.rpush(key, json.dumps(entry))


app = make_app(
    os.environ.get("CELERY_INTERVAL_DEMO_BROKER", "memory://"),
    os.environ.get("CELERY_INTERVAL_DEMO_STORE", "memory://"),
    QUEUE,
    float(os.environ.get("CELERY_INTERVAL_DEMO_INTERVAL", "0.05")),
)


@worker_process_init.connect
def _warm_up(**_: Any) -> None:
    """Open each pool process's recording connection before its first timed start (only when
    this module's app records to a Redis: another app that imports it runs its own)."""
    if is_redis_url(str(app.conf.interval_store_url)):
        record_start(app.conf.interval_store_url, RECORD_KEY + ":warmup", {"pid": os.getpid()})


# shared=False: the demo's tasks stay in its own app, not in every app of a process that
# imports this module (an IntervalTask there would make that app's queues interval queues).
@app.task(base=IntervalTask, bind=True, name="demo.call_api", shared=False)
def call_api(self: Any, i: int) -> int:
    """The demo's rate-sensitive call: records when it really started."""
    return _record_call(self, i)


def _record_call(self: Any, i: int) -> int:
    mono_ns = time.monotonic_ns()
    record_start(
        app.conf.interval_store_url,
        RECORD_KEY,
        {
            "mono_ns": mono_ns,
            "i": i,
            "id": self.request.id,
            "ticket": self.request.get("interval_ticket"),
            "worker": self.request.hostname or socket.gethostname(),
        },
    )
    return i
