"""The Celery app that real test workers run: tasks record their start on the store's clock."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

import redis
from celery import Celery
from celery.signals import task_failure, task_prerun, worker_process_init

from celery_interval import IntervalTask, Throttled
from celery_interval.demo import app as demo_app


def make_app(broker: str, store: str, queue: str, interval_s: float, **conf: Any) -> Celery:
    """The demo's app factory: what a user writes, nothing more (the library itself makes the
    workers survive broker channel errors)."""
    return demo_app.make_app(broker, store, queue, interval_s, **conf)


_recorder: redis.Redis | None = None


def recorder() -> redis.Redis:
    """A connection to the store's Redis, opened once per process (before the first task)."""
    global _recorder
    if _recorder is None:
        url = os.environ.get("CI_TEST_RECORD") or os.environ["CI_TEST_STORE"]
        _recorder = redis.Redis.from_url(url)
        _recorder.ping()
    return _recorder


def _record(task: Any, kind: str, *extra: Any) -> None:
    mono_ns = time.monotonic_ns()  # one exact clock for every worker on this host
    conn = recorder()
    seconds, micros = conn.time()
    entry = {
        "kind": kind,
        "us": seconds * 1_000_000 + micros,
        "id": task.request.id,
        "ticket": task.request.get("interval_ticket"),
        "retries": task.request.retries,
        "host": task.request.hostname,
        "pid": os.getpid(),
        "args": list(extra),
        "mono_ns": mono_ns,
        "deadline_ns": task.request.get("interval_start_ns"),
        "su": task.request.get("interval_start_us"),  # the admitted start, the store's clock
        # the worker's estimate of the store clock's offset that mapped su to deadline_ns
        "offset_ns": task.request.get("interval_clock_offset_ns"),
        "handoff_ms": (
            (task.request.get("prerun_ns") or 0) - (task.request.get("interval_claimed_ns") or 0)
        )
        / 1e6,
        "prerun_late_ms": (
            (task.request.get("prerun_ns") or 0) - (task.request.get("interval_start_ns") or 0)
        )
        / 1e6,
        "late_ms": (mono_ns - (task.request.get("interval_start_ns") or mono_ns)) / 1e6,
    }
    conn.rpush(f"record:{os.environ['CI_TEST_QUEUE']}", json.dumps(entry))


if os.environ.get("CI_TEST_BROKER"):
    extra_conf = json.loads(os.environ.get("CI_TEST_CONF", "{}"))
    app = make_app(
        os.environ["CI_TEST_BROKER"],
        os.environ["CI_TEST_STORE"],
        os.environ["CI_TEST_QUEUE"],
        float(os.environ.get("CI_TEST_INTERVAL", "0.02")),
        **extra_conf,
    )
    if os.environ.get("CI_TEST_DECLARED_QUEUES"):  # production's declared queues, none made up
        from kombu import Queue

        declared = (os.environ["CI_TEST_QUEUE"], f"{os.environ['CI_TEST_QUEUE']}-plain")
        app.conf.task_queues = [Queue(name) for name in declared]
        app.conf.task_create_missing_queues = False

    @worker_process_init.connect
    def _open_recorder(**_: Any) -> None:
        recorder()

    @task_failure.connect
    def _note_failure(task_id: str = "", exception: Any = None, **_: Any) -> None:
        """Every task_failure signal, in a list of its own (a failed task has no start)."""
        entry = {"id": task_id, "error": f"{type(exception).__name__}: {exception}"}
        recorder().rpush(f"failure:{os.environ['CI_TEST_QUEUE']}", json.dumps(entry))

    @task_prerun.connect
    def _note_prerun(task: Any = None, **_: Any) -> None:
        if task is not None:
            task.request.prerun_ns = time.monotonic_ns()

    @app.task(base=IntervalTask, bind=True, name="workerapp.record")
    def record(self: Any, i: int, sleep_s: float = 0.0, fail_times: int = 0) -> int:
        _record(self, "start", i)
        if self.request.retries < fail_times:
            raise self.retry(countdown=0)
        if sleep_s:
            time.sleep(sleep_s)
        return i

    @app.task(
        base=IntervalTask,
        bind=True,
        name="workerapp.tenant",
        interval=float(os.environ.get("CI_TEST_TENANT_INTERVAL", "0.1")),
        interval_bucket=lambda args, kwargs: args[0],
    )
    def tenant(self: Any, tenant: str, i: int) -> int:
        _record(self, "tenant", tenant, i)
        return i

    @app.task(base=IntervalTask, bind=True, name="workerapp.record_late", acks_late=True)
    def record_late(self: Any, i: int, sleep_s: float = 0.0) -> int:
        _record(self, "start", i)
        if sleep_s:
            time.sleep(sleep_s)
        _record(self, "end", i)
        return i

    @app.task(base=IntervalTask, bind=True, name="workerapp.span")
    def span(self: Any, i: int, sleep_s: float = 0.0) -> int:
        """Records its start and its end (acked early, unlike ``record_late``)."""
        _record(self, "start", i)
        if sleep_s:
            time.sleep(sleep_s)
        _record(self, "end", i)
        return i

    @app.task(
        base=IntervalTask,
        bind=True,
        name="workerapp.weighed",
        interval_cost=lambda args, kwargs: kwargs.get("units", 1),
    )
    def weighed(self: Any, i: int, units: int = 1) -> int:
        """Costs ``units`` (the option), unless its message carries a cost of its own."""
        _record(self, "start", i, self.request.get("interval_cost"))
        return i

    def _call_api(task: Any, i: int, url: str) -> int:
        """One GET of a (limiting) HTTP server; a 429 raises ``Throttled`` from its headers."""
        _record(task, "start", i)
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                status = int(reply.status)
        except urllib.error.HTTPError as exc:
            if exc.code != 429:
                raise
            throttled = Throttled.from_response(exc)
            _record(task, "throttled", i, throttled.retry_after_s)
            raise throttled from None
        _record(task, "ok", i, status)
        return i

    @app.task(base=IntervalTask, bind=True, name="workerapp.call_api")
    def call_api(self: Any, i: int, url: str) -> int:
        return _call_api(self, i, url)

    @app.task(base=IntervalTask, bind=True, name="workerapp.call_api_late", acks_late=True)
    def call_api_late(self: Any, i: int, url: str) -> int:
        return _call_api(self, i, url)

    @app.task(
        base=IntervalTask,
        bind=True,
        name="workerapp.tenant_kw",
        interval_bucket=lambda args, kwargs: kwargs["tenant"],
    )
    def tenant_kw(self: Any, i: int, tenant: str = "") -> int:
        """Its bucket callable raises KeyError when a call forgets ``tenant=``."""
        _record(self, "tenant_kw", i)
        return i

    if os.environ.get("CI_TEST_TASK_INTERVAL"):

        @app.task(
            base=IntervalTask,
            bind=True,
            name="workerapp.own_interval",
            interval=os.environ["CI_TEST_TASK_INTERVAL"],
        )
        def own_interval(self: Any, i: int) -> int:
            """A task with its own ``interval`` option, as the environment gives it."""
            _record(self, "start", i)
            return i

    _hoard: list[bytes] = []

    @app.task(base=IntervalTask, bind=True, name="workerapp.hog")
    def hog(self: Any, i: int, mb: int = 0) -> int:
        """Records its start, then keeps ``mb`` MB in its process (``--max-memory-per-child``)."""
        _record(self, "start", i)
        _hoard.append(b"x" * (mb * 1024 * 1024))
        return i

    @app.task(base=IntervalTask, bind=True, name="workerapp.follow_up")
    def follow_up(self: Any, i: int, how: str, wait_s: float) -> int:
        """Its first run waits ``wait_s``, then retries or replaces itself (``how``) with a
        run that records ``ok``."""
        _record(self, "start", i)
        if self.request.retries or self.request.get("follow_up_of"):
            _record(self, "ok", i)
            return i
        time.sleep(wait_s)
        if how == "retry":
            raise self.retry(countdown=0)
        raise self.replace(self.si(i, how, wait_s).set(headers={"follow_up_of": self.request.id}))

    @app.task(bind=True, name="workerapp.plain")
    def plain(self: Any, i: int) -> int:
        _record(self, "plain", i)
        return i
