"""Which tasks are paced, and where one message's start is scheduled: bucket, interval, store id."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from celery_interval.buckets import check_bucket
from celery_interval.config.declarations import Declaration, parse_own
from celery_interval.config.values import check_int
from celery_interval.errors import ConfigurationError, TransientError, UnknownBucket, short_repr
from celery_interval.headers import BUCKET_HEADER, NESTING_HEADER, SEND_HEADER, SEND_ONCE

__all__ = [
    "BUG_ERRORS",
    "PACED_STRATEGY",
    "Arrival",
    "Placement",
    "bucket_of",
    "call_option",
    "generation_of",
    "interval_of",
    "is_paced",
    "mark_id_of",
    "own_of",
    "placement_of",
    "retries_of",
]

#: The task strategy that defers a task to its slot: IntervalTask's, by name.
PACED_STRATEGY = "celery_interval.worker.strategy:interval_strategy"
#: A send's code sits above this many bits of the store's ``retries`` (32 more: below 2**53).
SEND_SHIFT = 20


#: What a task's ``interval_bucket`` or ``interval_cost`` callable raises on a bug in the call
#: or in itself (a ``KeyError`` for an argument the call left out): the message fails visibly.
#: Anything else it raises (``ConnectionError``, ``TimeoutError``, a database client's error)
#: may pass: ``TransientError``, and the worker tries the message again with backoff.
BUG_ERRORS: tuple[type[Exception], ...] = (
    LookupError,
    TypeError,
    ValueError,
    AttributeError,
    NameError,
    ArithmeticError,
    AssertionError,
    NotImplementedError,
)


def call_option(
    name: str, fn: Callable[[Sequence[Any], Mapping[str, Any]], object], arrival: Arrival
) -> object:
    """``fn(args, kwargs)`` of a task option ``name``: a bug's error as ``ConfigurationError``,
    any other as ``TransientError``."""
    try:
        return fn(arrival.args, arrival.kwargs)
    except BUG_ERRORS as exc:
        raise ConfigurationError(f"{name} raised {short_repr(exc)}") from exc
    except Exception as exc:
        raise TransientError(f"{name} raised {short_repr(exc)}") from exc


def is_paced(task: Any) -> bool:
    """Whether ``task`` is an IntervalTask (its class names the interval strategy)."""
    return getattr(task, "Strategy", None) == PACED_STRATEGY


class Arrival(NamedTuple):
    """One message as a worker received it: its task, headers (with its ``id``), arguments,
    and the queue it was consumed from (None when the delivery did not say)."""

    task: Any
    headers: Mapping[str, Any]
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    queue: str | None


def bucket_of(arrival: Arrival) -> str:
    """The bucket of one message: header override, task option (a name, or a key inside the
    queue's bucket), else the queue the message was consumed from."""
    task, headers, queue = arrival.task, arrival.headers, arrival.queue
    override = headers.get(BUCKET_HEADER)
    if override is not None:
        return check_bucket(override, f"message header {BUCKET_HEADER}=")
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
    key = call_option(f"{task.name}.interval_bucket", spec, arrival)
    if key is None or key == "":
        raise ConfigurationError(
            f"{task.name}.interval_bucket returned {key!r}: expected a key such as a tenant id"
        )
    return check_bucket(f"{base}:{key}", f"{task.name}.interval_bucket gave bucket ")


def own_of(task: Any) -> Declaration | None:
    """The task's own declaration for its bucket: its ``interval`` option (an interval or a
    declaration), whose fields win over the bucket's in ``interval_queues``; None: none.
    Parsed once per option value (every send and every message asks)."""
    own = getattr(task, "interval", None)
    if own is None:
        return None
    parsed = getattr(task, "_interval_own", None)
    if parsed is None or parsed[0] is not own:
        parsed = (own, parse_own(own, f"{task.name}.interval"))
        task._interval_own = parsed
    declaration: Declaration = parsed[1]
    return declaration


def interval_of(task: Any, bucket: str, configured: Callable[[str], int]) -> int:
    """The task's own interval (its ``interval`` option), else the configured interval of its
    bucket (µs)."""
    own = own_of(task)
    if own is None or own.interval_us is None:
        return configured(bucket)
    return own.interval_us


def retries_of(headers: Mapping[str, Any]) -> int:
    """The message's retry count: an integer >= 0, else an error."""
    retries = headers.get("retries")
    if retries is None:
        return 0
    return check_int(retries, "message header retries", 0)


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
    check_int(nesting, f"message header {NESTING_HEADER}", 0)
    return f"{task_id}~{nesting}"


class Placement(NamedTuple):
    """Where one message's start is scheduled, and its id in the store."""

    bucket: str
    interval_us: int
    task_id: str
    retries: int


def placement_of(arrival: Arrival, configured: Callable[[str], int]) -> Placement:
    """Bucket, interval, store id and retry count of one message; ``ConfigurationError``
    names the header, task option or bucket at fault."""
    headers = arrival.headers
    bucket = bucket_of(arrival)
    try:
        interval_us = interval_of(arrival.task, bucket, configured)
    except UnknownBucket as exc:
        if headers.get(BUCKET_HEADER) is None:
            raise
        raise UnknownBucket(f"message header {BUCKET_HEADER}={short_repr(bucket)}: {exc}") from None
    task_id = mark_id_of(headers["id"], headers)
    return Placement(bucket, interval_us, task_id, generation_of(headers))
