"""The test workers' app plus one fault hook: SIGKILL this worker right after an OK claim."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

from workerapp import app, recorder

from celery_interval.worker.service import IntervalService

__all__ = ["app"]

#: SIGKILL the worker (main process and pool children) right after its Nth OK claim, before
#: the task reaches a pool process or the broker sees an ack: the narrowest window there is.
KILL_AFTER_CLAIM = int(os.environ.get("CI_TEST_KILL_AFTER_CLAIM", "0"))

if KILL_AFTER_CLAIM:
    _original_start = IntervalService._start
    _claims = 0

    def _start_or_die(self: IntervalService, held: Any, start_ns: int) -> None:
        global _claims
        _claims += 1
        if _claims == KILL_AFTER_CLAIM:
            recorder().rpush(f"killed:{os.environ['CI_TEST_QUEUE']}", held.request.id)
            children = subprocess.run(
                ["pgrep", "-P", str(os.getpid())], capture_output=True, text=True
            ).stdout.split()
            for pid in children:
                os.kill(int(pid), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        _original_start(self, held, start_ns)

    IntervalService._start = _start_or_die  # type: ignore[method-assign]
