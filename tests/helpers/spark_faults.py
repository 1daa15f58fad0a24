"""A fault for the fan-out: one Spark task attempt that fails halfway through its sends."""

from __future__ import annotations

from typing import Any


def fail_once_router(at: int, partition: int = 0) -> Any:
    """A Celery router (``conf={"task_routes": (router,)}``) that fails the first attempt of
    ``partition`` at its ``at``-th send, so that exactly ``at - 1`` of that attempt's messages
    were published before it fails; it routes nothing (``None``: the queue given stays).

    The router runs in the executor's Python worker, inside the fan-out's partition function
    (Celery routes every ``send_task``), with Spark's ``TaskContext`` of the running attempt;
    each task deserializes its own copy, so the count starts at 0 in each."""
    sent = [0]

    def route(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any) -> None:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == partition and ctx.attemptNumber() == 0:
            sent[0] += 1
            if sent[0] >= at:
                raise RuntimeError(f"injected: partition {partition}, attempt 0, send {at}")
        return None

    return route
