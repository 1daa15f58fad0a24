"""Python helpers to pause, unpause, re-time and inspect a bucket, with or without workers."""

from __future__ import annotations

from dataclasses import replace
from fnmatch import fnmatchcase
from typing import Any

from celery_interval import signals
from celery_interval.app_store import store_of
from celery_interval.buckets import is_bucket_name, queue_of
from celery_interval.config import settings_of
from celery_interval.config.intervals import parse_interval_us
from celery_interval.errors import UnknownBucket, short_repr
from celery_interval.placement import is_paced, own_of
from celery_interval.schedule import Pace, Status, Unset
from celery_interval.schedule.outer import status_nested
from celery_interval.stores.scan import read_statuses, store_buckets

__all__ = [
    "configured_interval_us",
    "configured_pace",
    "pause",
    "read_paced",
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


def configured_pace(app: Any, bucket: str) -> Pace:
    """A bucket's configured interval (``configured_interval_us``), burst and extra limits:
    what its status is read with."""
    settings = settings_of(app)
    return Pace(
        configured_interval_us(app, bucket),
        burst=settings.burst_of(bucket),
        limits=settings.limits_of(bucket),
    )


def _task_buckets(app: Any) -> dict[str, int]:
    """Buckets named by IntervalTask options (``interval`` with a queue or static bucket)."""
    found: dict[str, int] = {}
    for task in list(app.tasks.values()):
        own = own_of(task) if is_paced(task) else None
        if own is None or own.interval_us is None:
            continue
        spec = getattr(task, "interval_bucket", None)
        name = spec if isinstance(spec, str) else getattr(task, "queue", None)
        if name:
            found[name] = own.interval_us
    return found


def pause(app: Any, queue: str, *, broadcast: bool = True) -> Status:
    """Pause ``queue`` cluster-wide: persisted in the store, broadcast to live workers. The
    status returned is read as ``status`` reads it (with the bucket's burst and limits).

    The broadcast says the store has it (``applied``): workers only act on it locally, so one
    that receives it late cannot undo a newer pause, unpause or interval."""
    pace = configured_pace(app, queue)
    result = _seen(app, queue, store_of(app).pause(queue, pace.interval_us, pace))
    signals.queue_paused.send(sender=queue, bucket=queue, status=result)
    if broadcast:
        app.control.broadcast("pause_queue", arguments={"queue": queue, "applied": True})
    return result


def unpause(app: Any, queue: str, *, broadcast: bool = True) -> Status:
    """Resume ``queue``; granted slots shift by the pause length, live workers wake at once."""
    pace = configured_pace(app, queue)
    result = _seen(app, queue, store_of(app).unpause(queue, pace.interval_us, pace))
    signals.queue_unpaused.send(sender=queue, bucket=queue, status=result)
    if broadcast:
        app.control.broadcast("unpause_queue", arguments={"queue": queue, "applied": True})
    return result


def set_interval(app: Any, queue: str, interval: object, *, broadcast: bool = True) -> Status:
    """Override ``queue``'s interval (seconds or a rate) for the whole pool."""
    new_interval_us = parse_interval_us(interval, name="interval")
    pace = configured_pace(app, queue)
    changed = store_of(app).set_interval(queue, pace.interval_us, new_interval_us, pace)
    result = _seen(app, queue, changed)
    signals.interval_changed.send(
        sender=queue, bucket=queue, status=result, interval_s=result.interval_us / 1e6, action="set"
    )
    if broadcast:
        app.control.broadcast(
            "set_interval", arguments={"queue": queue, "interval": str(interval), "applied": True}
        )
    return result


def unset_interval(app: Any, queue: str, *, broadcast: bool = True) -> Unset:
    """Drop ``queue``'s ``set_interval`` override for the whole pool: its configured interval
    is back, with no new epoch (``dropped`` is False when it had none: nothing changed)."""
    pace = configured_pace(app, queue)
    unset = store_of(app).unset_interval(queue, pace.interval_us, pace)
    result = replace(unset, status=_seen(app, queue, unset.status))
    signals.interval_changed.send(
        sender=queue,
        bucket=queue,
        status=result.status,
        interval_s=result.status.interval_us / 1e6,
        action="unset",
    )
    if broadcast:
        app.control.broadcast("unset_interval", arguments={"queue": queue, "applied": True})
    return result


def reset(app: Any, queue: str) -> None:
    """Forget ``queue``'s state: a new epoch, its first start one interval from now."""
    configured_interval_us(app, queue)
    store_of(app).reset(queue)
    signals.bucket_reset.send(sender=queue, bucket=queue)


def status(app: Any, queue: str) -> Status:
    """Read ``queue``'s state from the store, with its burst and extra limits: the next slot
    is the one a ticket would get now, ``units_left`` each budget's."""
    pace = configured_pace(app, queue)
    return _seen(app, queue, store_of(app).status(queue, pace.interval_us, pace))


def statuses(app: Any, match: str = "*") -> tuple[list[tuple[str, Status]], list[str]]:
    """The status of every bucket configured by name or with state in the store whose name
    matches the glob ``match``, read in pipelined batches; and the stored buckets left out as no
    configured queue or bucket names them."""
    configured = [b for b in settings_of(app).buckets() if fnmatchcase(b, match)]
    stored = store_buckets(store_of(app), match) or []
    wanted: list[tuple[str, Pace]] = []
    unknown: list[str] = []
    for bucket in sorted({*configured, *stored}):
        try:
            wanted.append((bucket, configured_pace(app, bucket)))
        except UnknownBucket:
            unknown.append(bucket)
    return read_paced(app, wanted), unknown


def read_paced(app: Any, wanted: list[tuple[str, Pace]]) -> list[tuple[str, Status]]:
    """The status of each ``(bucket, pace)``, read in batches (``read_statuses``), a nested
    bucket's beside its outer bucket's."""
    found = read_statuses(store_of(app), wanted)
    return _beside_outers(app, [(bucket, st) for (bucket, _), st in zip(wanted, found)])


def _seen(app: Any, bucket: str, found: Status) -> Status:
    """``found``, the status of ``bucket``, beside its outer bucket's if it is nested."""
    [(_, seen)] = _beside_outers(app, [(bucket, found)])
    return seen


def _beside_outers(app: Any, found: list[tuple[str, Status]]) -> list[tuple[str, Status]]:
    """Each nested bucket's status beside its outer bucket's (``status_nested``: paused while
    the outer is); the outer buckets not in ``found`` are read too, in one batch."""
    outer_of = settings_of(app).outer_of
    outers = {bucket: outer for bucket, _ in found if (outer := outer_of(bucket)) is not None}
    if not outers:
        return found
    alone = dict(found)
    missing = sorted({outer.bucket for outer in outers.values()} - alone.keys())
    paces = [(name, configured_pace(app, name)) for name in missing]
    alone.update(zip(missing, read_statuses(store_of(app), paces)))
    return [
        (bucket, st if (o := outers.get(bucket)) is None else status_nested(st, alone[o.bucket], o))
        for bucket, st in found
    ]


def status_dict(result: Status) -> dict[str, Any]:
    """A JSON-friendly view of a Status, in seconds."""
    return {
        "exists": result.exists,
        "epoch": result.epoch,
        "interval_s": result.interval_us / 1e6,
        "overridden": result.overridden,
        "adapted": result.adapted,
        "paused": result.paused,
        "outer": result.outer,
        "outer_paused": result.outer_paused,
        "tickets": result.ticket,
        "next_slot_in_s": result.next_slot_in_us / 1e6,
        "units_left": list(result.units_left),
        "running": result.running,
    }
