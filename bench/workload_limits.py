"""The Celery tasks of bench/limits.py: one HTTP GET to the limiting server, four ways to pace.

Run by the bench as ``celery -A workload_limits worker`` with ``bench/`` on PYTHONPATH. Each task
calls the API once (its own client, in this module: ``requests`` when installed, else urllib),
and records its completion in the recorder Redis when the call was accepted. On a 429:

- ``limits.rate_limited`` (Celery ``rate_limit``), ``limits.plain_retry`` (no limit) and
  ``limits.interval_retry`` (IntervalTask) retry with ``countdown`` = the server's Retry-After;
- ``limits.interval_throttled`` (IntervalTask) raises ``celery_interval.Throttled.from_response``
  and leaves the wait to the package (adaptive pace: the queue declared ``adaptive`` in
  ``BENCH_CONF``).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery.signals import worker_process_init, worker_ready
from limiting_server import ENV_API, parse_retry_after
from recording import (
    ENV_BROKER,
    ENV_RATE_LIMIT,
    ENV_STORE,
    ENV_TASK,
    QUEUE,
    conf,
    interval_s,
    record_ready,
    record_start,
    recorder,
)

from celery_interval import IntervalTask
from celery_interval.demo.app import make_app

#: Countdown when a 429 names no wait the client can read.
DEFAULT_WAIT_S = 1.0
INTERVAL_TASKS = ("limits.interval_retry", "limits.interval_throttled")

TASK = os.environ.get(ENV_TASK, "")
app = make_app(os.environ[ENV_BROKER], os.environ[ENV_STORE], QUEUE, interval_s(), **conf())
if TASK not in INTERVAL_TASKS:
    app.conf.interval_queues = {}  # the other systems' workers run plain Celery


@dataclass(frozen=True)
class Response:
    """What a call answered: the status and headers (``requests``' names)."""

    status_code: int
    headers: Mapping[str, str]
    #: The client's own response object (requests.Response, or urllib's), for Throttled.
    raw: Any = None


class _Client:
    """One kept-alive HTTP session per process (opened after the fork), proxies ignored."""

    def __init__(self) -> None:
        self.url = os.environ[ENV_API].rstrip("/") + "/api/call"
        try:
            import requests
        except ImportError:
            self._session: Any = None
            self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        else:
            self._session = requests.Session()
            self._session.trust_env = False

    def get(self) -> Response:
        if self._session is not None:
            r = self._session.get(self.url, timeout=30)
            return Response(r.status_code, r.headers, r)
        try:
            with self._opener.open(self.url, timeout=30) as r:
                r.read()
                return Response(r.status, r.headers, r)
        except urllib.error.HTTPError as e:
            e.read()
            return Response(e.code, e.headers, e)


_client: _Client | None = None


def client() -> _Client:
    global _client
    if _client is None:
        _client = _Client()
    return _client


@worker_process_init.connect
def _open_connections(**_: Any) -> None:
    recorder()
    client()
    record_ready("pool-child")


@worker_ready.connect
def _ready(**_: Any) -> None:
    record_ready("worker")


def _done(task: Any, i: int) -> int:
    record_start(task.request.id, i, task.request.retries, task.request.hostname or "")
    return i


def _call_or_retry(task: Any, i: int) -> int:
    resp = client().get()
    if resp.status_code == 429:
        wait = parse_retry_after(resp.headers)
        raise task.retry(countdown=DEFAULT_WAIT_S if wait is None else wait)
    if resp.status_code != 200:
        raise RuntimeError(f"the API answered {resp.status_code}")
    return _done(task, i)


@app.task(
    bind=True,
    name="limits.rate_limited",
    rate_limit=os.environ.get(ENV_RATE_LIMIT) or None,
    max_retries=None,
)
def rate_limited(self: Any, i: int) -> int:
    """Celery's rate_limit (a token bucket in each worker) at the rate the user believes."""
    return _call_or_retry(self, i)


@app.task(bind=True, name="limits.plain_retry", max_retries=None)
def plain_retry(self: Any, i: int) -> int:
    """No limit at all: only the server's 429 and Retry-After slow it down."""
    return _call_or_retry(self, i)


if TASK == "limits.interval_retry":

    @app.task(base=IntervalTask, bind=True, name="limits.interval_retry", max_retries=None)
    def interval_retry(self: Any, i: int) -> int:
        """IntervalTask at the believed interval; a 429 retries with the server's countdown."""
        return _call_or_retry(self, i)


if TASK == "limits.interval_throttled":
    from celery_interval import Throttled  # type: ignore[attr-defined]  # the API being built

    @app.task(base=IntervalTask, bind=True, name="limits.interval_throttled", max_retries=None)
    def interval_throttled(self: Any, i: int) -> int:
        """IntervalTask at the believed interval; a 429 raises Throttled (adaptive pace)."""
        resp = client().get()
        if resp.status_code == 429:
            raise Throttled.from_response(resp.raw)
        if resp.status_code != 200:
            raise RuntimeError(f"the API answered {resp.status_code}")
        return _done(self, i)
