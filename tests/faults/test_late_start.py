"""A pool process that reaches its task late claims a new start and may wait for it: a worker
killed during that wait must leave the task to the broker, not take it along acknowledged."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

import pytest

import celery_interval

pytestmark = pytest.mark.slow

INTERVAL_S = 0.2


def pool_children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(child) for child in found.split()]


@pytest.mark.parametrize("broker", ["rabbitmq", "redis"])
def test_a_worker_killed_while_a_late_process_waits_leaves_the_task(
    make_pool: Any, broker: str
) -> None:
    """One worker, one pool process, stopped (SIGSTOP) before the task comes: the worker claims
    the start and hands the task over, the start passes. The queue is paused, the process
    continued: it finds itself late, claims again and waits for the pause. The worker is
    SIGKILLed meanwhile. A new worker runs the task once the queue is unpaused: its message
    was never acknowledged, since its body had not begun."""
    conf = {"interval_pause_poll_s": 1.0}
    if broker == "redis":
        conf["broker_transport_options"] = {  # type: ignore[assignment]
            "visibility_timeout": 2.0,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }
    pool = make_pool(INTERVAL_S, broker=broker, conf=conf, loglevel="INFO")
    (first,) = pool.start(1, concurrency=1)
    (child,) = pool_children(first.proc.pid)
    os.kill(child, signal.SIGSTOP)
    try:
        (task_id,) = pool.send(1)
        deadline = time.monotonic() + 30
        while "slot in" not in first.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(10 * INTERVAL_S)  # the admitted start passes while the process is stopped
        celery_interval.pause(pool.app, pool.queue, broadcast=False)
    finally:
        os.kill(child, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while "claiming a new start" not in first.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "claiming a new start" in first.log(), first.log()[-2000:]
    time.sleep(0.5)  # the process waits for the pause now
    assert not pool.records(), "the body ran during the pause"
    pool.kill(first)
    celery_interval.unpause(pool.app, pool.queue, broadcast=False)
    pool.start(1, concurrency=1)
    records = pool.wait_records(1, timeout_s=60)
    assert [r["id"] for r in records] == [task_id]
