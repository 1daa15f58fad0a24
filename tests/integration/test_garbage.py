"""A worker frees each message by reference count: nothing per task is left to the GC."""

from __future__ import annotations

import gc
import time
from typing import Any

from celery.contrib.testing.worker import start_worker
from celery.worker.request import Request

from celery_interval import IntervalTask
from celery_interval.demo.app import make_app

QUEUE = "gc"
TASKS = 20


def _left_by_the_worker(garbage: list[Any]) -> list[str]:
    """What in ``garbage`` a message on the worker's side made: its request, our closures."""
    left = []
    for obj in garbage:
        module = getattr(type(obj), "__module__", "") or ""
        if callable(obj) and not isinstance(obj, type):
            module = getattr(obj, "__module__", "") or module
        if isinstance(obj, Request) or module.startswith("celery_interval"):
            left.append(getattr(obj, "__qualname__", type(obj).__qualname__))
    return left


def test_a_message_leaves_no_reference_cycle(redis_server: Any) -> None:
    app = make_app(
        redis_server.broker_url_for(5),
        redis_server.url_for(0),
        QUEUE,
        0.001,
        result_backend=redis_server.url_for(6),
        interval_key_prefix="gc:",
    )

    @app.task(base=IntervalTask, name="gc.noop")
    def noop(i: int) -> int:
        return i

    app.loader.import_module("celery.contrib.testing.tasks")
    with start_worker(app, pool="solo", perform_ping_check=False, queues=[QUEUE]):
        assert [r.get(timeout=30) for r in [noop.delay(i) for i in range(3)]] == [0, 1, 2]
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            results = [noop.delay(i) for i in range(TASKS)]
            assert [r.get(timeout=30) for r in results] == list(range(TASKS))
            time.sleep(0.2)  # the deferred acks and done marks
            gc.collect()
            left = _left_by_the_worker(gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert not left, f"{len(left)} objects of {TASKS} tasks were freed only by the GC: {left[:6]}"
