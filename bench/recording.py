"""What bench workers record (body starts on CLOCK_MONOTONIC, readiness) and where, set by env."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis

#: Environment the bench sets for every worker process.
ENV_BROKER = "BENCH_BROKER"
ENV_STORE = "BENCH_STORE"
ENV_RECORD = "BENCH_RECORD"
ENV_INTERVAL = "BENCH_INTERVAL_S"
ENV_RATE_LIMIT = "BENCH_RATE_LIMIT"
ENV_CONF = "BENCH_CONF"
ENV_TASK = "BENCH_TASK"

QUEUE = "bench"
STARTS_KEY = "bench:starts"
READY_KEY = "bench:ready"

_conn: redis.Redis | None = None


def recorder() -> redis.Redis:
    """This process's connection to the recording Redis (not the one being measured)."""
    global _conn
    if _conn is None:
        _conn = redis.Redis.from_url(os.environ[ENV_RECORD])
        _conn.ping()
    return _conn


def record_start(task_id: str, i: int, retries: int, worker: str, key: str = "") -> None:
    """Record one body start (of a tenant ``key``'s task); the clock is read first."""
    mono_ns = time.monotonic_ns()
    entry = {"id": task_id, "i": i, "retries": retries, "worker": worker, "mono_ns": mono_ns}
    if key:
        entry["key"] = key
    recorder().rpush(STARTS_KEY, json.dumps(entry))


def record_ready(kind: str) -> None:
    """Tell the bench that one worker process (or pool child) is ready."""
    recorder().rpush(READY_KEY, json.dumps({"kind": kind, "pid": os.getpid()}))


def interval_s() -> float:
    return float(os.environ[ENV_INTERVAL])


def conf() -> dict[str, Any]:
    """Extra Celery settings for the bench (JSON in the environment)."""
    return dict(json.loads(os.environ.get(ENV_CONF) or "{}"))
