"""The test workers' app plus one task whose bucket lookup fails while the test says so."""

from __future__ import annotations

import os
from typing import Any

from celery_interval import IntervalTask

#: While this key (with the queue's name after it) is in the recorder's Redis, the lookup of
#: ``storeerrors.looked_up``'s bucket raises ConnectionError.
LOOKUP_DOWN = "lookup-down:"

if os.environ.get("CI_TEST_BROKER"):  # a test worker
    from tests.helpers.workerapp import _record, app, recorder

    def _tenant(args: Any, kwargs: Any) -> str:
        if recorder().exists(LOOKUP_DOWN + os.environ["CI_TEST_QUEUE"]):
            raise ConnectionError("tenant directory unreachable")
        return "t1"

    @app.task(base=IntervalTask, bind=True, name="storeerrors.looked_up", interval_bucket=_tenant)
    def looked_up(self: Any, i: int) -> int:
        _record(self, "start", i)
        return i

    __all__ = ["app"]
