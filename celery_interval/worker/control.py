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


@inspect_command(args=[("top", int), ("match", str)], signature="[top=20 [match=GLOB]]")
def interval_stats(
    state: Any,
    top: Any = 20,
    match: Any = None,
    buckets: Any = None,
    tasks: Any = 10,
    **_: Any,
) -> dict[str, Any]:
    """Per bucket on this worker (the top buckets by held tasks, 0 = all, whose names match the
    glob): interval, paused, held tasks with tickets (the first few), counters."""
    for name, value in (("top", top), ("tasks", tasks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return {"error": f"interval_stats: {name} must be an integer >= 0, got {value!r}"}
    if match is not None and not isinstance(match, str):
        return {"error": f"interval_stats: match must be a glob string, got {match!r}"}
    if buckets is not None and (
        not isinstance(buckets, list) or not all(isinstance(b, str) for b in buckets)
    ):
        return {"error": "interval_stats: buckets must be a list of bucket names"}
    service = _service(state)
    if service is None:
        return {}
    snapshot: dict[str, Any] = service.snapshot(top=top, match=match, buckets=buckets, tasks=tasks)
    return snapshot


@control_command(args=[("queue", str)], signature="<queue>")
def unset_interval(state: Any, queue: Any = None, **_: Any) -> dict[str, Any]:
    """Drop an interval queue's set_interval override: its configured interval is back."""
    return _run(lambda: control.unset_interval(state.app, queue, broadcast=False).status)


__all__ += ["unset_interval"]
