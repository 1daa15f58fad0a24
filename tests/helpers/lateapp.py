"""The test workers' app, where a worker given a gate file runs its pause, unpause and interval
commands only once the file exists: its broadcasts come late, as after a cut connection."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery.worker.control import Panel

import celery_interval.worker.control  # noqa: F401  (registers the commands wrapped here)
from tests.helpers.workerapp import app

__all__ = ["app"]

#: Hold this worker's control commands (its whole event loop) until this file exists.
GATE = os.environ.get("CI_TEST_CONTROL_GATE", "")
GATE_TIMEOUT_S = 120.0


def _late(handler: Any) -> Any:
    def run_late(state: Any, **arguments: Any) -> Any:
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not Path(GATE).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return handler(state, **arguments)

    return run_late


if GATE:
    for command in ("pause_queue", "unpause_queue", "set_interval", "unset_interval"):
        Panel.data[command] = _late(Panel.data[command])
