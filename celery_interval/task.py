"""IntervalTask: the base class that routes a task's starts through its bucket's slots."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any, NamedTuple

from celery import Task

from celery_interval.errors import ConfigurationError, UnknownBucket, short_repr
from celery_interval.intervals import parse_interval_us
from celery_interval.worker import started

__all__ = [
    "BUCKET_HEADER",
    "MAX_BUCKET_CHARS",
    "START_HEADER",
    "IntervalTask",
    "Placement",
    "bucket_of",
    "drop_internal_headers",
    "interval_of",
    "placement_of",
    "retries_of",
]

BUCKET_HEADER = "interval_bucket"
START_HEADER = "interval_start_ns"
SPIN_HEADER = "interval_spin_ns"
CLAIMED_HEADER = "interval_claimed_ns"
TICKET_HEADER = "interval_ticket"
#: The bucket of an ordinary (early-ack) task, whose pool process marks it done before its body.
MARK_HEADER = "interval_mark"
#: Set by the worker on the request it releases; a message's own copies are stale or forged
#: (Celery copies custom headers into a retry's message).
INTERNAL_HEADERS = (START_HEADER, SPIN_HEADER, CLAIMED_HEADER, TICKET_HEADER, MARK_HEADER)
#: The pool process spins (rather than sleeps) the last stretch before a start, at most this
#: long and a fifth of the interval: a halted idle vCPU can wake a sleeper late (p50 lateness
#: 0.04 ms spinning, 0.17 ms not). A longer spin is preempted on a busy host: beside two CPU
#: hogs on 2 cores, 32 and 5 of 200 starts came >3 ms late spinning 2 ms, 3 and 3 at 0.5 ms.
MAX_SPIN_NS = 500_000
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
        start_ns = request.get(START_HEADER)
        if isinstance(start_ns, int):
            bucket = request.get(MARK_HEADER)
            post = None
            if isinstance(bucket, str):
                post = started.poster(self.app, bucket, request.id, request.retries or 0)
            wait_until(start_ns, int(request.get(SPIN_HEADER) or 0), post)
        return super().__call__(*args, **kwargs)


def spin_ns_for(interval_us: int) -> int:
    """How long a pool process spins before a start of a bucket with this interval."""
    return min(MAX_SPIN_NS, interval_us * 200)


def wait_until(deadline_ns: int, spin_ns: int, on_spin: Callable[[], None] | None = None) -> None:
    """Sleep until ``spin_ns`` before a monotonic deadline, then spin: waking from sleep can
    be milliseconds late on a VM whose idle vCPU was halted; a running process is on time.

    ``on_spin`` runs as the spin begins, so what it costs comes off the spin, not the start:
    a write to the store wakes redis-server, which may take this CPU for a while.
    """
    sleep_ns = deadline_ns - spin_ns - time.monotonic_ns()
    if sleep_ns > 0:
        time.sleep(sleep_ns / 1e9)
    if on_spin is not None:
        on_spin()
    while time.monotonic_ns() < deadline_ns:
        pass


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
    routing_key: str | None,
) -> str:
    """The bucket of one message: header override, task option, else the task's queue."""
    override = headers.get(BUCKET_HEADER)
    if override is not None:
        return _check_bucket(override, f"message header {BUCKET_HEADER}=")
    base = getattr(task, "queue", None) or routing_key or task.app.conf.task_default_queue
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
    """The message's retry count (part of its dedupe key): an integer >= 0, else an error."""
    retries = headers.get("retries")
    if retries is None:
        return 0
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigurationError(
            f"message header retries={short_repr(retries)}: expected an integer >= 0"
        )
    return retries


class Placement(NamedTuple):
    """Where one message's start is scheduled."""

    bucket: str
    interval_us: int
    retries: int


def placement_of(
    task: Any,
    headers: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    routing_key: str | None,
    configured: Callable[[str], int],
) -> Placement:
    """Bucket, interval and retry count of one message; ``ConfigurationError`` names the
    header, task option or bucket at fault."""
    bucket = bucket_of(task, headers, args, kwargs, routing_key)
    try:
        interval_us = interval_of(task, bucket, configured)
    except UnknownBucket as exc:
        if headers.get(BUCKET_HEADER) is None:
            raise
        raise UnknownBucket(f"message header {BUCKET_HEADER}={short_repr(bucket)}: {exc}") from None
    return Placement(bucket, interval_us, retries_of(headers))


def drop_internal_headers(headers: MutableMapping[str, Any]) -> None:
    """Forget the worker's own headers a message arrived with (stale, or forged)."""
    for name in INTERNAL_HEADERS:
        headers.pop(name, None)
