"""IntervalTask: the base class that routes a task's starts through its bucket's slots."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from celery import Task

from celery_interval.errors import ConfigurationError, UnknownBucket, short_repr
from celery_interval.headers import (
    BUCKET_HEADER,
    NESTING_HEADER,
    SEND_HEADER,
    SEND_ONCE,
    START_HEADER,
)
from celery_interval.intervals import parse_interval_us
from celery_interval.worker import started

__all__ = [
    "MAX_BUCKET_CHARS",
    "IntervalTask",
    "Placement",
    "bucket_of",
    "generation_of",
    "interval_of",
    "mark_id_of",
    "placement_of",
    "retries_of",
]

#: A send's code sits above this many bits of the store's ``retries`` (32 more: below 2**53).
SEND_SHIFT = 20
#: A bucket name is part of every store key of the bucket: longer ones are refused.
MAX_BUCKET_CHARS = 200

BucketSpec = str | Callable[[Sequence[Any], Mapping[str, Any]], object] | None


class IntervalTask(Task):  # type: ignore[misc]
    """A task whose starts are spaced by its bucket's interval across the whole pool."""

    Strategy = "celery_interval.worker.strategy:interval_strategy"
    #: Seconds or a rate ("10/s"); default: the bucket's entry in ``interval_queues``.
    interval: float | str | None = None
    #: A bucket name, or a callable of (args, kwargs) giving a key inside the queue's bucket.
    interval_bucket: BucketSpec = None

    @classmethod
    def on_bound(cls, app: Any) -> None:
        from celery_interval.install import install

        install(app)
        _check_options(cls)

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        *,
        interval_bucket: str | None = None,
        **options: Any,
    ) -> Any:
        """Send as usual; ``interval_bucket=`` overrides the bucket of this one call."""
        if interval_bucket is not None:
            _check_bucket(interval_bucket, "interval_bucket=")
            options["headers"] = {**(options.get("headers") or {}), BUCKET_HEADER: interval_bucket}
        return super().apply_async(args, kwargs, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.get(START_HEADER) is not None:
            started.before_body(self.app, request)
        return super().__call__(*args, **kwargs)


def _check_options(cls: type[IntervalTask]) -> None:
    """A task's ``interval`` and ``interval_bucket`` options, checked when it is bound."""
    name = getattr(cls, "name", None) or cls.__name__
    if cls.interval is not None:
        parse_interval_us(cls.interval, name=f"{name}.interval")
    spec = inspect.getattr_static(cls, "interval_bucket", None)
    if isinstance(spec, str):
        _check_bucket(spec, f"{name}.interval_bucket=")
    elif spec is not None and not callable(spec) and not isinstance(spec, classmethod):
        raise ConfigurationError(
            f"{name}.interval_bucket={short_repr(spec)}: expected a bucket name or a callable "
            "of (args, kwargs) returning a key"
        )


def _check_bucket(bucket: object, what: str) -> str:
    """``bucket`` if it is a usable bucket name; else ConfigurationError quoting ``what``."""
    if not isinstance(bucket, str) or not bucket:
        raise ConfigurationError(f"{what}{short_repr(bucket)}: expected a non-empty string")
    if len(bucket) > MAX_BUCKET_CHARS:
        raise ConfigurationError(
            f"{what}{short_repr(bucket)}: a bucket name is at most {MAX_BUCKET_CHARS} characters"
        )
    return bucket


def bucket_of(
    task: Any,
    headers: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    queue: str | None,
) -> str:
    """The bucket of one message: header override, task option (a name, or a key inside the
    queue's bucket), else the queue the message was consumed from."""
    override = headers.get(BUCKET_HEADER)
    if override is not None:
        return _check_bucket(override, f"message header {BUCKET_HEADER}=")
    base = queue or getattr(task, "queue", None) or task.app.conf.task_default_queue
    spec = getattr(task, "interval_bucket", None)
    if spec is not None:
        # Read statically: a function stored on the task class would otherwise bind as a method.
        spec = inspect.getattr_static(task, "interval_bucket", None)
    if isinstance(spec, (staticmethod, classmethod)):
        spec = spec.__get__(None, type(task))
    if spec is None:
        return str(base)
    if isinstance(spec, str):
        return spec
    try:
        key = spec(args, kwargs)
    except Exception as exc:
        raise ConfigurationError(f"{task.name}.interval_bucket raised {short_repr(exc)}") from exc
    if key is None or key == "":
        raise ConfigurationError(
            f"{task.name}.interval_bucket returned {key!r}: expected a key such as a tenant id"
        )
    return _check_bucket(f"{base}:{key}", f"{task.name}.interval_bucket gave bucket ")


def interval_of(task: Any, bucket: str, configured: Callable[[str], int]) -> int:
    """The task's own ``interval`` option, else the configured interval of its bucket (µs)."""
    own = getattr(task, "interval", None)
    if own is None:
        return configured(bucket)
    return parse_interval_us(own, name=f"{task.name}.interval")


def retries_of(headers: Mapping[str, Any]) -> int:
    """The message's retry count: an integer >= 0, else an error."""
    retries = headers.get("retries")
    if retries is None:
        return 0
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigurationError(
            f"message header retries={short_repr(retries)}: expected an integer >= 0"
        )
    return retries


def generation_of(headers: Mapping[str, Any]) -> int:
    """The store's ``retries`` of a message (its dedupe key with the task id): the retry count,
    with the send's code above its lowest ``SEND_SHIFT`` bits, so that a task id sent again is
    a new message while a redelivered copy of one send is dropped."""
    retries = retries_of(headers)
    send = headers.get(SEND_HEADER)
    if send is None or send == SEND_ONCE:
        return retries
    if not isinstance(send, str) or len(send) != 8 or not _is_hex(send):
        raise ConfigurationError(
            f"message header {SEND_HEADER}={short_repr(send)}: expected 8 hex digits"
        )
    if retries >= 1 << SEND_SHIFT:
        raise ConfigurationError(f"message header retries={retries}: at most {(1 << 20) - 1}")
    return (int(send, 16) << SEND_SHIFT) | retries


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)


def mark_id_of(task_id: str, headers: Mapping[str, Any]) -> str:
    """The message's id in the store: ``task.replace`` sends a new message under the same task
    id (with ``replaced_task_nesting`` one higher), which must not pass for a copy of the first.
    """
    nesting = headers.get(NESTING_HEADER)
    if not nesting:
        return task_id
    if isinstance(nesting, bool) or not isinstance(nesting, int) or nesting < 0:
        raise ConfigurationError(
            f"message header {NESTING_HEADER}={short_repr(nesting)}: expected an integer >= 0"
        )
    return f"{task_id}~{nesting}"


class Placement(NamedTuple):
    """Where one message's start is scheduled, and its id in the store."""

    bucket: str
    interval_us: int
    task_id: str
    retries: int


def placement_of(
    task: Any,
    headers: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    queue: str | None,
    configured: Callable[[str], int],
) -> Placement:
    """Bucket, interval, store id and retry count of one message (``headers`` holds its ``id``);
    ``ConfigurationError`` names the header, task option or bucket at fault."""
    bucket = bucket_of(task, headers, args, kwargs, queue)
    try:
        interval_us = interval_of(task, bucket, configured)
    except UnknownBucket as exc:
        if headers.get(BUCKET_HEADER) is None:
            raise
        raise UnknownBucket(f"message header {BUCKET_HEADER}={short_repr(bucket)}: {exc}") from None
    task_id = mark_id_of(headers["id"], headers)
    return Placement(bucket, interval_us, task_id, generation_of(headers))
