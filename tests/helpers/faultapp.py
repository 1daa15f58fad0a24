"""The test workers' app plus fault hooks: SIGKILL this worker right after an OK claim, or
after a task's body started but before the broker saw its ack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import Any

from celery_interval.worker.slots import SlotCycle
from tests.helpers.workerapp import app, recorder

__all__ = ["app"]

#: SIGKILL the worker (main process and pool children) right after its Nth OK claim, before
#: the task reaches a pool process or the broker sees an ack: the narrowest window there is.
KILL_AFTER_CLAIM = int(os.environ.get("CI_TEST_KILL_AFTER_CLAIM", "0"))

#: SIGKILL the worker when Celery asks it to ack its Nth task, once that task's body has
#: started in a pool process (its start is recorded): the ack never reaches the broker.
KILL_BEFORE_ACK = int(os.environ.get("CI_TEST_KILL_BEFORE_ACK", "0"))


def _die(task_id: str) -> None:
    """Note the task, then SIGKILL this worker's pool processes and itself."""
    recorder().rpush(f"killed:{os.environ['CI_TEST_QUEUE']}", task_id)
    children = subprocess.run(
        ["pgrep", "-P", str(os.getpid())], capture_output=True, text=True
    ).stdout.split()
    for pid in children:
        os.kill(int(pid), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _wait_for_start(task_id: str, timeout_s: float = 5.0) -> None:
    key = f"record:{os.environ['CI_TEST_QUEUE']}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(json.loads(r)["id"] == task_id for r in recorder().lrange(key, 0, -1)):
            return
        time.sleep(0.001)


if KILL_AFTER_CLAIM:
    _original_start = SlotCycle._start
    _claims = 0

    def _start_or_die(self: SlotCycle, held: Any, *start: int) -> None:
        global _claims
        _claims += 1
        if _claims == KILL_AFTER_CLAIM:
            _die(held.request.id)
        _original_start(self, held, *start)

    SlotCycle._start = _start_or_die  # type: ignore[method-assign]

if KILL_BEFORE_ACK:
    from celery_interval.worker import strategy

    _original_track_ack = strategy.track_ack
    _acks = 0

    def _track_ack_or_die(req: Any, service: Any, copy: Any, acks_late: bool) -> None:
        _original_track_ack(req, service, copy, acks_late)
        ack = req._on_ack

        def ack_or_die(*args: Any, **kwargs: Any) -> None:
            global _acks
            _acks += 1
            if _acks == KILL_BEFORE_ACK:
                _wait_for_start(req.id)
                _die(req.id)
            ack(*args, **kwargs)

        req._on_ack = ack_or_die

    strategy.track_ack = _track_ack_or_die
