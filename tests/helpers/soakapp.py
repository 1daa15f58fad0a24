"""The soak's Celery app: every feature on, and task bodies that record their starts and ends in
a recorder Redis no fault touches, timed on the host's CLOCK_MONOTONIC (one clock for all)."""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from typing import Any

import redis
from celery import Celery
from celery.exceptions import Ignore
from celery.signals import worker_process_init

from celery_interval import IntervalTask, Throttled
from tests.helpers.soak_config import CAP_BODY_S, TENANT_S, Layout

#: The recorder's list of start, end and throttled records.
RECORD_KEY = "soak:records"


#: Parking's trail of task ids (DEBUG): a seed that loses a task shows where it went.
logging.getLogger("celery_interval.worker.parking").setLevel(logging.DEBUG)


def make_app(broker: str, store: str, prefix: str) -> Celery:
    """The soak's app: its queues and every feature's settings from ``Layout``."""
    layout = Layout(prefix)
    app = Celery("soak", broker=broker, set_as_current=False)
    app.conf.update(
        interval_store_url=store,
        task_default_queue=layout.main,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        control_exchange=f"celery-{prefix}",
        **layout.conf(),
    )
    if broker.startswith("amqp"):
        # a publish into a broker that just died raises instead of vanishing
        app.conf.broker_transport_options = {"confirm_publish": True}
    if broker.startswith("redis"):
        app.conf.broker_transport_options = {
            "visibility_timeout": 4.0,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }
    return app


_recorder: redis.Redis | None = None


def recorder() -> redis.Redis:
    global _recorder
    if _recorder is None:
        _recorder = redis.Redis.from_url(os.environ["CI_SOAK_RECORD"])
        _recorder.ping()
    return _recorder


def note(task: Any, kind: str, job: str, bucket: str, **extra: Any) -> None:
    """One record: the body's monotonic time, and the start its worker handed it: its deadline
    on this host's clock and the admitted start on the store's."""
    entry = {
        "k": kind,
        "job": job,
        "task": task.name,
        "id": task.request.id,
        "r": task.request.retries,
        "b": bucket,
        "host": task.request.hostname,
        "mono": time.monotonic_ns(),
        "dl": task.request.get("interval_start_ns"),
        "su": task.request.get("interval_start_us"),
        **extra,
    }
    recorder().rpush(RECORD_KEY, json.dumps(entry))


if os.environ.get("CI_SOAK_PREFIX"):
    LAYOUT = Layout(os.environ["CI_SOAK_PREFIX"])
    app = make_app(os.environ["CI_SOAK_BROKER"], os.environ["CI_SOAK_STORE"], LAYOUT.prefix)

    @worker_process_init.connect
    def _open_recorder(**_: Any) -> None:
        recorder()

    @app.task(base=IntervalTask, bind=True, name="soak.step")
    def step(self: Any, job: str, fail_times: int = 0) -> str:
        """A main-queue task; it retries ``fail_times`` times. A body's end is recorded once
        its follow-up went: killed before, the follow-up is lost as Celery's is."""
        note(self, "start", job, LAYOUT.main)
        if self.request.retries < fail_times:
            retry = self.retry(countdown=0, max_retries=fail_times, throw=False)
            note(self, "end", job, LAYOUT.main)
            raise retry
        note(self, "end", job, LAYOUT.main)
        return job

    @app.task(base=IntervalTask, bind=True, name="soak.replacer")
    def replacer(self: Any, job: str) -> Any:
        """Replaces itself with ``soak.step`` of job ``<job>/r``."""
        note(self, "start", job, LAYOUT.main)
        try:
            self.replace(step.si(f"{job}/r").set(queue=LAYOUT.main))
        except Ignore:  # the replacement went
            note(self, "end", job, LAYOUT.main)
            raise

    @app.task(
        base=IntervalTask,
        bind=True,
        name="soak.tenant",
        interval=TENANT_S,
        interval_bucket=lambda args, kwargs: args[1],
        interval_cost=lambda args, kwargs: kwargs.get("units", 1),
    )
    def tenant(self: Any, job: str, key: str, units: int = 1) -> str:
        note(self, "start", job, f"{LAYOUT.tenants}:{key}", cost=units)
        note(self, "end", job, f"{LAYOUT.tenants}:{key}")
        return job

    @app.task(base=IntervalTask, bind=True, name="soak.limited")
    def limited(self: Any, job: str) -> str:
        note(self, "start", job, LAYOUT.limited)
        note(self, "end", job, LAYOUT.limited)
        return job

    @app.task(base=IntervalTask, bind=True, name="soak.capped")
    def capped(self: Any, job: str) -> str:
        note(self, "start", job, LAYOUT.capped)
        time.sleep(CAP_BODY_S)
        note(self, "end", job, LAYOUT.capped)
        return job

    @app.task(base=IntervalTask, bind=True, name="soak.call_api")
    def call_api(self: Any, job: str) -> str:
        """One GET of the limiting HTTP server; a 429 raises ``Throttled`` from its headers."""
        note(self, "start", job, LAYOUT.throttled)
        try:
            with urllib.request.urlopen(os.environ["CI_SOAK_API"], timeout=10) as reply:
                reply.read()
        except urllib.error.HTTPError as exc:
            if exc.code != 429:
                raise
            throttled = Throttled.from_response(exc)
            note(self, "throttled", job, LAYOUT.throttled, after_s=throttled.retry_after_s)
            raise throttled from None
        note(self, "end", job, LAYOUT.throttled)
        return job
