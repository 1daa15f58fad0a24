"""Python helpers to pause, unpause, re-time and inspect a bucket, with or without workers."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from celery_interval import signals
from celery_interval.app_store import store_of
from celery_interval.buckets import is_bucket_name, queue_of
from celery_interval.config import settings_of
from celery_interval.errors import UnknownBucket, short_repr
from celery_interval.intervals import parse_interval_us
from celery_interval.placement import is_paced
from celery_interval.schedule import Status, Unset
from celery_interval.stores.scan import read_statuses, store_buckets

__all__ = [
    "configured_interval_us",
    "pause",
    "reset",
    "set_interval",
    "status",
    "status_dict",
    "statuses",
    "unpause",
    "unset_interval",
]


def configured_interval_us(app: Any, bucket: str) -> int:
    """The interval of a configured bucket (or ``queue:key`` of one); else ``UnknownBucket``
    naming it and the configured ones."""
    settings = settings_of(app)
    if not is_bucket_name(bucket):
        task_buckets = _task_buckets(app)
    else:
        try:
            return settings.interval_us(bucket)
        except UnknownBucket:
            task_buckets = _task_buckets(app)
            for name in (bucket, queue_of(bucket)):
                if name in task_buckets:
                    return task_buckets[name]
    known = sorted({*settings.buckets(), *task_buckets})
    raise UnknownBucket(
        f"unknown interval bucket {short_repr(bucket)}; configured: {', '.join(known) or 'none'}"
    )


def _task_buckets(app: Any) -> dict[str, int]:
    """Buckets named by IntervalTask options (``interval`` with a queue or static bucket)."""
    found: dict[str, int] = {}
    for task in list(app.tasks.values()):
        own = getattr(task, "interval", None)
        if not is_paced(task) or own is None:
            continue
        spec = getattr(task, "interval_bucket", None)
        name = spec if isinstance(spec, str) else getattr(task, "queue", None)
        if name:
            found[name] = parse_interval_us(own, name=f"{task.name}.interval")
    return found


def pause(app: Any, queue: str, *, broadcast: bool = True) -> Status:
    """Pause ``queue`` cluster-wide: persisted in the store, broadcast to live workers."""
    interval_us = configured_interval_us(app, queue)
    result = store_of(app).pause(queue, interval_us)
    signals.queue_paused.send(sender=queue, bucket=queue, status=result)
    if broadcast:
        app.control.broadcast("pause_queue", arguments={"queue": queue})
    return result


def unpause(app: Any, queue: str, *, broadcast: bool = True) -> Status:
    """Resume ``queue``; granted slots shift by the pause length, live workers wake at once."""
    interval_us = configured_interval_us(app, queue)
    result = store_of(app).unpause(queue, interval_us)
    signals.queue_unpaused.send(sender=queue, bucket=queue, status=result)
    if broadcast:
        app.control.broadcast("unpause_queue", arguments={"queue": queue})
    return result


def set_interval(app: Any, queue: str, interval: object, *, broadcast: bool = True) -> Status:
    """Override ``queue``'s interval (seconds or a rate) for the whole pool."""
    new_interval_us = parse_interval_us(interval, name="interval")
    interval_us = configured_interval_us(app, queue)
    result = store_of(app).set_interval(queue, interval_us, new_interval_us)
    signals.interval_changed.send(
        sender=queue, bucket=queue, status=result, interval_s=result.interval_us / 1e6, action="set"
    )
    if broadcast:
        app.control.broadcast("set_interval", arguments={"queue": queue, "interval": str(interval)})
    return result


def unset_interval(app: Any, queue: str, *, broadcast: bool = True) -> Unset:
    """Drop ``queue``'s ``set_interval`` override for the whole pool: its configured interval
    is back, with no new epoch (``dropped`` is False when it had none: nothing changed)."""
    interval_us = configured_interval_us(app, queue)
    result = store_of(app).unset_interval(queue, interval_us)
    signals.interval_changed.send(
        sender=queue,
        bucket=queue,
        status=result.status,
        interval_s=result.status.interval_us / 1e6,
        action="unset",
    )
    if broadcast:
        app.control.broadcast("unset_interval", arguments={"queue": queue})
    return result


def reset(app: Any, queue: str) -> None:
    """Forget ``queue``'s state: a new epoch, its first start one interval from now."""
    configured_interval_us(app, queue)
    store_of(app).reset(queue)
    signals.bucket_reset.send(sender=queue, bucket=queue)


def status(app: Any, queue: str) -> Status:
    """Read ``queue``'s state from the store."""
    interval_us = configured_interval_us(app, queue)
    return store_of(app).status(queue, interval_us)


def statuses(app: Any, match: str = "*") -> tuple[list[tuple[str, Status]], list[str]]:
    """The status of every bucket configured by name or with state in the store whose name
    matches the glob ``match``, read in pipelined batches; and the stored buckets left out as no
    configured queue or bucket names them."""
    configured = [b for b in settings_of(app).buckets() if fnmatchcase(b, match)]
    stored = store_buckets(store_of(app), match) or []
    wanted: list[tuple[str, int]] = []
    unknown: list[str] = []
    for bucket in sorted({*configured, *stored}):
        try:
            wanted.append((bucket, configured_interval_us(app, bucket)))
        except UnknownBucket:
            unknown.append(bucket)
    found = read_statuses(store_of(app), wanted)
    return [(bucket, st) for (bucket, _), st in zip(wanted, found)], unknown


def status_dict(result: Status) -> dict[str, Any]:
    """A JSON-friendly view of a Status, in seconds."""
    return {
        "exists": result.exists,
        "epoch": result.epoch,
        "interval_s": result.interval_us / 1e6,
        "overridden": result.overridden,
        "adapted": result.adapted,
        "paused": result.paused,
        "tickets": result.ticket,
        "next_slot_in_s": result.next_slot_in_us / 1e6,
    }
