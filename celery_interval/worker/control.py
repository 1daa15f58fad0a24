"""Remote control: pause_queue, unpause_queue, set_interval, unset_interval, interval_stats;
and ``inspect scheduled``, which also lists the interval tasks held for their slot."""

from __future__ import annotations

import logging
from typing import Any

from celery.worker import control as celery_control
from celery.worker.control import control_command, inspect_command

from celery_interval import control
from celery_interval.config import check_int, settings_of
from celery_interval.config.intervals import parse_interval_us
from celery_interval.errors import ConfigurationError, StoreError
from celery_interval.shares import with_shares

__all__ = [
    "interval_stats",
    "pause_queue",
    "scheduled",
    "set_interval",
    "unpause_queue",
    "unset_interval",
]

logger = logging.getLogger("celery_interval.worker")

_celery_scheduled = celery_control.Panel.data["scheduled"]
#: The event each command sends on success: ``interval-<this>``.
_EVENTS = {
    "pause_queue": "paused",
    "unpause_queue": "unpaused",
    "set_interval": "set",
    "unset_interval": "unset",
}


def _service(state: Any) -> Any:
    return getattr(state.consumer, "interval_service", None)


def _run(state: Any, command: str, queue: Any, action: Any, fresh: Any = None) -> dict[str, Any]:
    """The command's reply: ``ok`` with the bucket's status, or ``error`` (an unknown queue,
    a bad or missing argument, an unreachable store) naming what was wrong; logged in one line
    and, for a success, sent as an ``interval-<action>`` event. For a broadcast the store already
    has, ``action`` only reads the status, and a status ``fresh`` rejects (a newer change is in
    the store) is logged and goes no further: its reply carries ``stale``."""
    try:
        found = action()
        status = control.status_dict(found)
    except (ConfigurationError, StoreError) as exc:  # an outage, a refusal, a damaged key
        logger.warning("interval: control %s %s failed: %s", command, queue, exc)
        return {"error": str(exc)}
    if fresh is not None and not fresh(found):
        logger.info(
            "interval: control %s %s came after a newer change; the store keeps interval %gs, %s",
            command,
            queue,
            status["interval_s"],
            "paused" if status["paused"] else "running",
        )
        return {"ok": status, "stale": True}
    logger.info(
        "interval: control %s %s: interval %gs%s, %s, ticket %d",
        command,
        queue,
        status["interval_s"],
        " (set)" if status["overridden"] else "",
        "paused" if status["paused"] else "running",
        status["tickets"],
    )
    service = _service(state)
    if service is not None:
        service.notify.control(_EVENTS[command], queue, status)
    return {"ok": status}


def _read(state: Any, queue: Any) -> Any:
    """What a broadcast the store already has does instead of writing: read the status."""
    return lambda: control.status(state.app, queue)


@control_command(args=[("queue", str)], signature="<queue>")
def pause_queue(state: Any, queue: Any = None, applied: Any = False, **_: Any) -> dict[str, Any]:
    """Pause starts of an interval queue on every worker (state kept in the store)."""
    if applied:
        return _run(state, "pause_queue", queue, _read(state, queue), lambda st: st.paused)
    return _run(
        state, "pause_queue", queue, lambda: control.pause(state.app, queue, broadcast=False)
    )


@control_command(args=[("queue", str)], signature="<queue>")
def unpause_queue(state: Any, queue: Any = None, applied: Any = False, **_: Any) -> dict[str, Any]:
    """Resume starts of an interval queue; held tasks keep their order and spacing."""
    if applied:
        reply = _run(state, "unpause_queue", queue, _read(state, queue), lambda st: not st.paused)
    else:
        reply = _run(
            state,
            "unpause_queue",
            queue,
            lambda: control.unpause(state.app, queue, broadcast=False),
        )
    service = _service(state)
    if "ok" in reply and "stale" not in reply and service is not None:
        outer_of = settings_of(state.app).outer_of
        for bucket in list(service.paused):
            nested = outer_of(bucket)
            if (
                bucket == queue
                or bucket.startswith(queue + ":")
                or (nested and nested.bucket == queue)
            ):
                service.wake(bucket)
    return reply


@control_command(
    args=[("queue", str), ("interval", str)], signature="<queue> <seconds | rate, e.g. 10/s>"
)
def set_interval(
    state: Any, queue: Any = None, interval: Any = None, applied: Any = False, **_: Any
) -> dict[str, Any]:
    """Change an interval queue's interval for the whole pool (kept in the store)."""
    if applied:
        try:
            wanted_us = parse_interval_us(interval, name="interval")
        except ConfigurationError as exc:
            return {"error": str(exc)}
        return _run(
            state,
            "set_interval",
            queue,
            _read(state, queue),
            lambda st: st.overridden and (st.adapted or st.interval_us == wanted_us),
        )
    return _run(
        state,
        "set_interval",
        queue,
        lambda: control.set_interval(state.app, queue, interval, broadcast=False),
    )


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
    glob): interval, paused, held tasks with tickets (the first few), bodies running here in a
    capped bucket's places, counters; a bucket nested in a fair outer, its place in the
    outer's share (``fair``)."""
    for name, value in (("top", top), ("tasks", tasks)):
        try:
            check_int(value, f"interval_stats: {name}", 0)
        except ConfigurationError as exc:
            return {"error": str(exc)}
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
    rows = {b: r for b, r in snapshot.items() if not b.startswith("_")}
    with_shares(service.settings, service.store, rows)
    return snapshot


@control_command(args=[("queue", str)], signature="<queue>")
def unset_interval(state: Any, queue: Any = None, applied: Any = False, **_: Any) -> dict[str, Any]:
    """Drop an interval queue's set_interval override: its configured interval is back."""
    if applied:
        return _run(
            state, "unset_interval", queue, _read(state, queue), lambda st: not st.overridden
        )
    return _run(
        state,
        "unset_interval",
        queue,
        lambda: control.unset_interval(state.app, queue, broadcast=False).status,
    )


@inspect_command(alias="dump_schedule")
def scheduled(state: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """List of currently scheduled ETA/countdown tasks, and of the interval tasks held for their
    slot (``eta``: the slot once granted; ``interval``: bucket, ticket and state)."""
    listed: list[dict[str, Any]] = list(_celery_scheduled(state, **kwargs))
    service = _service(state)
    if service is not None:
        listed.extend(service.scheduled())
    return listed
