"""Remote control commands: pause_queue, unpause_queue, set_interval, inspect interval_stats."""

from __future__ import annotations

from typing import Any

from celery.worker.control import control_command, inspect_command

from celery_interval import control
from celery_interval.errors import ConfigurationError, StoreUnavailable

__all__ = ["interval_stats", "pause_queue", "set_interval", "unpause_queue"]


def _service(state: Any) -> Any:
    return getattr(state.consumer, "interval_service", None)


def _run(action: Any) -> dict[str, Any]:
    """The command's reply: ``ok`` with the bucket's status, or ``error`` (an unknown queue,
    a bad or missing argument, an unreachable store) naming what was wrong."""
    try:
        return {"ok": control.status_dict(action())}
    except (ConfigurationError, StoreUnavailable) as exc:
        return {"error": str(exc)}


@control_command(args=[("queue", str)], signature="<queue>")
def pause_queue(state: Any, queue: Any = None, **_: Any) -> dict[str, Any]:
    """Pause starts of an interval queue on every worker (state kept in the store)."""
    return _run(lambda: control.pause(state.app, queue, broadcast=False))


@control_command(args=[("queue", str)], signature="<queue>")
def unpause_queue(state: Any, queue: Any = None, **_: Any) -> dict[str, Any]:
    """Resume starts of an interval queue; held tasks keep their order and spacing."""
    reply = _run(lambda: control.unpause(state.app, queue, broadcast=False))
    service = _service(state)
    if "ok" in reply and service is not None:
        for bucket in list(service.paused):
            if bucket == queue or bucket.startswith(queue + ":"):
                service.wake(bucket)
    return reply


@control_command(
    args=[("queue", str), ("interval", str)], signature="<queue> <seconds | rate, e.g. 10/s>"
)
def set_interval(state: Any, queue: Any = None, interval: Any = None, **_: Any) -> dict[str, Any]:
    """Change an interval queue's interval for the whole pool (kept in the store)."""
    return _run(lambda: control.set_interval(state.app, queue, interval, broadcast=False))


@inspect_command()
def interval_stats(state: Any, **_: Any) -> dict[str, Any]:
    """Per bucket on this worker: interval, paused, held tasks with tickets, counters."""
    service = _service(state)
    return {} if service is None else service.snapshot()
